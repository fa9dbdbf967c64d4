"""CUDA event synchronisation links: which launch a ``cudaEventRecord`` captured and which launch a
``cudaStreamWaitEvent`` holds back, with HTA 0.5.0's matching (by time on the event's GPU and stream,
and on the waiting thread and stream)."""
from __future__ import annotations

import numpy as np

from .counters import LAUNCH_CALLS
from .model import RankView


def event_links(v: RankView, pos_of_index, kept) -> tuple[dict[int, int], dict[int, int]]:
    """(cudaEventRecord correlation -> the last launch call on the event's GPU and stream before the
    record, cudaStreamWaitEvent call -> the next launch call on its thread and stream), as events."""
    ev = v.ev
    sym = {n: i for i, n in enumerate(ev.names)}
    record, wait = sym.get("cudaEventRecord"), sym.get("cudaStreamWaitEvent")
    streams: dict[int, tuple] = {}  # recorded event's correlation -> (GPU, stream) it was recorded on
    if record is not None and ev.sync_args:
        sync_pos = pos_of_index(np.fromiter(ev.sync_args, dtype=np.int64, count=len(ev.sync_args)))
        for p, (ws, corr) in zip(sync_pos.tolist(), ev.sync_args.values()):
            if ws > -1 and p >= 0 and kept[p]:
                streams.setdefault(corr, (ev.threads[ev.thread[p]][0], ws))
    if not streams and wait is None:
        return {}, {}
    pos = np.flatnonzero(kept)
    ic = v.index_correlation
    calls = pos[np.isin(ev.name[pos], [sym[n] for n in LAUNCH_CALLS if n in sym]) & (ic[pos] > 0)]
    calls = calls[(ev.ts[calls]).argsort(kind="quicksort")]
    kernel = pos_of_index(ic[calls])
    ok = (kernel >= 0)
    ok[ok] &= (ev.stream[kernel[ok]] != -1) & (ic[kernel[ok]] > 0)
    calls, kernel = calls[ok], kernel[ok]
    k_stream = ev.stream[kernel].astype(np.int64)
    prev: dict[int, int] = {}
    if streams:
        recs = pos[ev.name[pos] == record]
        recs = recs[[int(ev.correlation[r]) in streams for r in recs.tolist()]]
        recs = recs[ev.ts[recs].argsort(kind="quicksort")]
        allp = np.concatenate([calls, recs])
        order = (ev.ts[allp]).argsort(kind="quicksort")
        key = [(ev.threads[c][0], s_) for c, s_ in zip(ev.thread[kernel].tolist(), k_stream.tolist())] + \
            [streams[int(ev.correlation[r])] for r in recs.tolist()]
        latest: dict[tuple, int] = {}
        for o in order.tolist():
            if o < len(calls):
                latest[key[o]] = int(calls[o])
            elif key[o] in latest:
                prev[int(ev.correlation[allp[o]])] = latest[key[o]]
    nxt: dict[int, int] = {}
    if wait is not None:
        waits = pos[(ev.name[pos] == wait) & (ic[pos] > 0)]
        gpu_side = pos_of_index(ic[waits])
        okw = gpu_side >= 0
        okw[okw] &= (ev.stream[gpu_side[okw]] != -1) & (ic[gpu_side[okw]] > 0)
        waits, gpu_side = waits[okw], gpu_side[okw]
        waits_sorted = (ev.ts[waits]).argsort(kind="quicksort")
        waits, gpu_side = waits[waits_sorted], gpu_side[waits_sorted]
        allp = np.concatenate([calls, waits])
        streams_all = np.concatenate([k_stream, ev.stream[gpu_side].astype(np.int64)]).tolist()
        thread = ev.thread[allp].tolist()  # a (pid, tid) code: the call's thread
        order = (ev.ts[allp]).argsort(kind="quicksort")
        upcoming: dict[tuple, int] = {}
        for o in order[::-1].tolist():
            key = (thread[o], streams_all[o])
            if o < len(calls):
                upcoming[key] = int(calls[o])
            elif key in upcoming:
                nxt[int(allp[o])] = upcoming[key]
    return prev, nxt
