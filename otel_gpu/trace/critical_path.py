"""Critical path of one rank's step, with HTA 0.5.0's ``critical_path_analysis`` semantics.

The graph has a start and an end node per CPU operator, CUDA runtime/driver call and GPU kernel in
the window. Edges (weights in us): operator and kernel spans, walked in call-stack order on each
CPU thread (a blocking sync call's span weighs 0); zero-weight dependencies between consecutive
top-level operators of a thread; a kernel launch delay (runtime call start -> kernel start) when
the stream was idle at launch, else a kernel-kernel gap on the stream; zero-weight sync edges from
a kernel's end to the end of the CPU call that waited for it (stream, context and event syncs) and
between kernels on two streams (``cudaStreamWaitEvent``). The critical path is the longest path;
each of its edges is classified as cpu_bound, gpu_compute_bound, gpu_communication_bound,
gpu_kernel_kernel_overhead or gpu_kernel_launch_overhead.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import partial

import numpy as np

from ..words import count
from .counters import queue_length_at_events
from .cp_graph import DEPENDENCY, KERNEL_GAP, LAUNCH, SPAN, SYNC, CriticalPathError, Graph
from .event_sync import event_links
from .model import COMMUNICATION, RankView, kernel_type
from .rank_pool import fork_map

BOUNDS = ("cpu_bound", "gpu_compute_bound", "gpu_communication_bound", "gpu_kernel_kernel_overhead",
          "gpu_kernel_launch_overhead")
BLOCKING_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventQuery", "cudaEventSynchronize",
                  "cudaMemcpy", "cudaMemcpyAsync")
OP_CATS = ("cpu_op", "cuda_runtime", "cuda_driver",
           "Operator", "Runtime")  # the last two: PyTorch 1.8-1.9 traces' names (HTA 0.5.0 fails on those)


PARALLEL_MIN_RANKS = 4  # below this one process computes every rank's path


def critical_paths(views: list[RankView], annotation: str = "ProfilerStep", instance: int | None = None,
                   jobs: int | None = None) -> list[dict]:
    """Every rank's critical path summary, or ``{"rank", "error"}`` where there is none; ranks are
    computed in forked worker processes (one per core) when there are several."""
    if len(views) < PARALLEL_MIN_RANKS:
        jobs = 1
    return fork_map(partial(one_rank, annotation=annotation, instance=instance), views, jobs)


def one_rank(v: RankView, annotation: str = "ProfilerStep", instance: int | None = None) -> dict:
    """One rank's critical path summary, or ``{"rank", "error"}`` where there is none."""
    try:
        return critical_path(v, annotation, instance)
    except CriticalPathError as exc:
        return {"rank": v.rank, "error": str(exc)}


@dataclass
class Window:
    """The part of the trace analysed: events of the CPU that start in [start, end] (us)."""

    start: float
    end: float
    label: str  # "ProfilerStep instance 1 of 3", "whole trace"
    annotation: str
    instance: int | None  # None: the whole trace


def find_window(v: RankView, annotation: str = "ProfilerStep", instance: int | None = None) -> Window:
    """The ``instance``-th event whose name contains ``annotation`` (HTA's row order), by default the
    second when there are two or more (the first step is usually atypical), else the first; the
    whole trace when ``annotation`` is empty or matches nothing."""
    ev, rows = v.ev, np.unique(v.rows)
    ts = ev.ts[rows] - v.ts0
    end = ts + ev.dur[rows]
    ids = [i for i, n in enumerate(ev.names) if annotation and annotation in n]
    ann = v.rows[np.isin(ev.name[v.rows], ids)] if ids else v.rows[:0]
    if not len(ann):
        if not len(rows):
            raise CriticalPathError("no events")
        return Window(float(ts.min()), float(end.max()), "whole trace", "", None)
    k = instance if instance is not None else (1 if len(ann) >= 2 else 0)
    if not 0 <= k < len(ann):
        raise CriticalPathError(f"instance {k} of {annotation!r} asked, the rank has {len(ann)} (0 to {len(ann) - 1})")
    r = ann[k]
    t0 = float(ev.ts[r] - v.ts0)
    return Window(t0, t0 + float(ev.dur[r]), f"{annotation} instance {k} of {len(ann)} ({ev.names[ev.name[r]]})",
                  annotation, k)


def _clip(v: RankView, win: Window, pos: np.ndarray, pos_of_index) -> np.ndarray:
    """HTA's clipping: CPU events (stream -1) starting in the window with a positive duration, and
    GPU events whose launching CPU event does, or named "Stream Wait Event"."""
    ev = v.ev
    ts = ev.ts[pos] - v.ts0
    cpu = ev.stream[pos] == -1
    a = pos[cpu & (ts >= win.start) & (ts <= win.end) & (ev.dur[pos] > 0)]
    launcher_ok = np.zeros(len(ev), dtype=bool)  # per GPU event: a launching CPU event is in the window
    cpu_pos = pos[cpu]
    ic = v.index_correlation[cpu_pos]
    cts = ev.ts[cpu_pos] - v.ts0
    good = (cts >= win.start) & (cts <= win.end) & (ev.dur[cpu_pos] > 0) & (ic >= 0)
    target = pos_of_index(ic[good])
    launcher_ok[target[target >= 0]] = True
    gpu_pos = pos[~cpu]
    wait_ids = [i for i, n in enumerate(ev.names) if n == "Stream Wait Event"]
    b = gpu_pos[launcher_ok[gpu_pos] | np.isin(ev.name[gpu_pos], wait_ids)]
    return np.union1d(a, b)


def _threads(v: RankView, clipped: np.ndarray) -> list[np.ndarray]:
    """Clipped events of each CPU thread, threads in (pid, tid) order; a thread with GPU events
    keeps only those (and is then not a CPU thread), as HTA's call graph does."""
    ev = v.ev
    groups: dict[int, list[int]] = defaultdict(list)
    for p, c in zip(clipped.tolist(), ev.thread[clipped].tolist()):
        groups[c].append(p)
    out = []
    for c in sorted(groups, key=lambda c: tuple((type(x).__name__, x) for x in ev.threads[c])):
        p = np.array(groups[c], dtype=np.int64)
        s = ev.stream[p]
        if (s > 0).any():
            continue  # a GPU stream (or a mix): no call stack
        if (s < 0).all():
            out.append(p)
    return out


def _stack_walk(v: RankView, p: np.ndarray):
    """(enter?, event, parent event or -1) in call-stack order: starts and ends sorted by time, at
    one time ends first; starts longest first, ends shortest first, then by event index."""
    ev = v.ev
    ts = (ev.ts[p] - v.ts0).astype(np.float64)
    dur = np.maximum(ev.dur[p], 0)
    idx = ev.index[p].astype(np.int64)
    n = len(p)
    time = np.concatenate([ts, ts + dur])
    kind = np.concatenate([np.ones(n), np.zeros(n)])  # end (0) before start (1)
    k1 = np.concatenate([-dur, dur])
    k2 = np.concatenate([idx, -idx])
    order = np.lexsort((k2, k1, kind, time))
    stack: list[int] = []
    parent: dict[int, int] = {}
    for o in order.tolist():
        if o < n:
            e = int(p[o])
            parent[e] = stack[-1] if stack else -1
            stack.append(e)
            yield True, e, parent[e]
        elif stack:
            e = stack.pop()
            yield False, e, parent[e]


def critical_path(v: RankView, annotation: str = "ProfilerStep", instance: int | None = None) -> dict:
    """The rank's critical path summary: window, length (us), share and us per bound, the events
    with the most time on the path, notes. Raises :class:`CriticalPathError` when there is none."""
    ev = v.ev
    win = find_window(v, annotation, instance)
    pos = np.unique(v.rows)
    index_sorted = ev.index  # file positions, increasing with the array position

    def pos_of_index(idx: np.ndarray) -> np.ndarray:
        j = np.minimum(np.searchsorted(index_sorted, idx), len(index_sorted) - 1)
        return np.where(index_sorted[j] == idx, j, -1)

    kept = np.zeros(len(ev), dtype=bool)
    kept[pos] = True
    clipped = _clip(v, win, pos, pos_of_index)
    cat_ids = [i for i, n in enumerate(ev.names) if n in OP_CATS]
    ic_all = v.index_correlation
    is_node = np.isin(ev.cat[clipped], cat_ids) | ((ev.stream[clipped] != -1) & (ic_all[clipped] >= 0))
    nodes_ev = clipped[is_node]
    if not len(nodes_ev):
        raise CriticalPathError(f"no operators or kernels in the window ({win.label})")
    ts = (ev.ts[nodes_ev] - v.ts0).astype(np.float64)
    all_ts = np.concatenate([ts, ts + ev.dur[nodes_ev]])
    order = all_ts.argsort(kind="quicksort")  # node ids in time order; ties as pandas sort_values
    node_of = np.empty(len(order), dtype=np.int64)
    node_of[order] = np.arange(len(order))
    m = len(nodes_ev)
    start_node = dict(zip(nodes_ev.tolist(), node_of[:m].tolist()))
    end_node = dict(zip(nodes_ev.tolist(), node_of[m:].tolist()))
    g = Graph(all_ts[order].tolist())
    node_event = np.concatenate([nodes_ev, nodes_ev])[order].tolist()
    node_is_start = (order < m).tolist()
    blocking = set(i for i, n in enumerate(ev.names) if n in BLOCKING_CALLS)
    is_blocking = dict(zip(nodes_ev.tolist(), np.isin(ev.name[nodes_ev], list(blocking)).tolist()))

    def attribute(u: int, w: int, parent: int) -> int:
        """The event an edge's time belongs to: the start node's event, else the end node's when
        both are ends, else (end -> start) the enclosing event."""
        if node_is_start[u]:
            return node_event[u]
        if not node_is_start[w]:
            return node_event[w]
        return parent

    for p in _threads(v, clipped):
        last = None  # node
        last_top = None
        depth = 0
        last_parent = -1
        for enter, e, parent in _stack_walk(v, p):
            if e not in start_node:
                continue
            s, t = start_node[e], end_node[e]
            if enter:
                if depth == 0 and last_top is not None:
                    g.add(last_top, s, DEPENDENCY)
                depth += 1
                if last is not None:
                    g.add(last, s, event=attribute(last, s, last_parent))
                last, last_parent = s, parent
            else:
                depth -= 1
                if last is not None:
                    g.add(last, t, zero=is_blocking[e], event=attribute(last, t, last_parent))
                if depth == 0:
                    last, last_top = None, t
                else:
                    last, last_parent = t, parent
    notes = _add_kernels(v, g, clipped, start_node, end_node, node_event, pos_of_index, kept)
    for u, w in g.syncs:
        if ev.stream[node_event[u]] != -1 and ev.stream[node_event[u]] == ev.stream[node_event[w]]:
            raise CriticalPathError("a sync edge joins two kernels of one stream (the trace's sync events "
                                    "do not match its kernels)")
    path = g.longest_path()
    return _summary(v, win, g, path, node_event, notes)


def _add_kernels(v, g: Graph, clipped, start_node, end_node, node_event, pos_of_index, kept) -> list[str]:
    """Kernel spans, launch delays, kernel-kernel gaps and sync edges; returns notes."""
    ev = v.ev
    names = ev.names
    notes: list[str] = []
    sym = {n: i for i, n in enumerate(names)}
    ic_all = v.index_correlation
    sync_cat = sym.get("cuda_sync", -1)
    if sync_cat < 0:
        notes.append("no CUDA sync events in the trace (PyTorch 2.1+ records them): CPU waits on the GPU are "
                     "not linked, so the path may run through a wait instead of the kernel it waited for")
    event_sync, context_sync = sym.get("Event Sync", -2), sym.get("Context Sync", -2)
    stream_sync, wait_event = sym.get("Stream Sync", -2), sym.get("Stream Wait Event", -2)
    c = clipped
    sel = c[((ev.stream[c] != -1) | np.isin(ev.name[c], [event_sync, context_sync])) & (ic_all[c] >= 0)]
    ts = (ev.ts[sel] - v.ts0).astype(np.float64)
    sort_by = np.where(ev.cat[sel] == sync_cat, ts + ev.dur[sel], ts)
    sel = sel[sort_by.argsort(kind="quicksort")]
    queue = queue_length_at_events(v)
    prev_launch, next_launch = event_links(v, pos_of_index, kept)
    last: dict[int, int] = {}  # stream -> end node of its last kernel
    kernel_sync: dict[int, int] = {}  # kernel event -> event of the kernel it waits for
    skipped = 0

    runtime_of = dict(zip(sel.tolist(), pos_of_index(ic_all[sel]).tolist()))  # event -> its CPU call (-1: none)
    for e in sel.tolist():
        if ev.cat[e] == sync_cat:
            name = int(ev.name[e])
            cpu = runtime_of[e]
            if name in (wait_event, event_sync):
                wait = ev.sync_args.get(int(ev.index[e]), (-1, -1))[1]
                launch = prev_launch.get(wait, -1)
                if launch < 0:
                    continue
                src = int(pos_of_index(np.array([ic_all[launch]]))[0])
                if name == wait_event:
                    dest_launch = next_launch.get(cpu, -1)
                    if dest_launch >= 0:
                        kernel_sync[int(pos_of_index(np.array([ic_all[dest_launch]]))[0])] = src
                elif src in end_node and cpu in end_node:
                    g.add(end_node[src], end_node[cpu], SYNC)
                continue
            if name in (stream_sync, context_sync) and cpu in end_node:
                waited = last.values() if name == context_sync else [last.get(int(ev.stream[e]))]
                for n in waited:
                    if n is not None:
                        g.add(n, end_node[cpu], SYNC)
            continue
        if e not in start_node:  # a sync-named event outside the cuda_sync category (HTA fails here)
            continue
        stream = int(ev.stream[e])
        s, t = start_node[e], end_node[e]
        g.add(s, t, event=e)
        sync_end = None
        src = kernel_sync.pop(e, None)
        if src is not None and src in end_node:
            sync_end = end_node[src]
            g.add(sync_end, s, SYNC)
        cpu = runtime_of[e]
        cpu_ts = float(ev.ts[cpu] - v.ts0) if cpu >= 0 else float("nan")
        prev = last.get(stream)
        idle_launch = (queue.get(int(ic_all[e])) == 1 and queue.get(int(ev.index[e])) == 0
                       and (prev is None or g.ts[prev] < cpu_ts)
                       and (sync_end is None or g.ts[sync_end] < cpu_ts))
        if idle_launch:
            if cpu in start_node:
                g.add(start_node[cpu], s, LAUNCH)
            else:
                skipped += 1
        elif prev is not None and (sync_end is None or g.ts[sync_end] < g.ts[prev]):
            g.add(prev, s, KERNEL_GAP, event=node_event[prev])  # the gap belongs to the earlier kernel
        last[stream] = t
    if skipped:
        notes.append(f"{count(skipped, 'kernel')} launched from outside the window: no launch edge (HTA stops here)")
    return notes


def _bound(v: RankView, kind: int, event: int | None) -> str:
    if kind == KERNEL_GAP:
        return "gpu_kernel_kernel_overhead"
    if kind == LAUNCH:
        return "gpu_kernel_launch_overhead"
    if kind != SPAN:
        return ""
    if event is None or event < 0 or v.ev.stream[event] < 0:
        return "cpu_bound"
    name = v.ev.names[v.ev.name[event]]
    return "gpu_communication_bound" if kernel_type(name) == COMMUNICATION else "gpu_compute_bound"


def _summary(v: RankView, win: Window, g: Graph, path, node_event, notes: list[str], top: int = 5) -> dict:
    us = dict.fromkeys(BOUNDS, 0.0)
    by_event: dict[str, list] = {}
    total = 0.0
    for u, w in path:
        _, own, kind, event = g.edges[(u, w)]
        total += own
        b = _bound(v, kind, event)
        if b:
            us[b] += own
        if kind == SPAN and event is not None and event >= 0 and own > 0:
            name = v.ev.names[v.ev.name[event]]
            slot = by_event.setdefault(name, [0.0, "gpu" if v.ev.stream[event] >= 0 else "cpu"])
            slot[0] += own
    pct = {b: (100.0 * x / total if total else float("nan")) for b, x in us.items()}
    events = sorted(by_event.items(), key=lambda kv: -kv[1][0])[:top]
    return {"rank": v.rank, "window": win.label, "window_start_us": win.start, "window_end_us": win.end,
            "annotation": win.annotation, "instance": win.instance, "length_us": total,
            "edges": len(path), **{f"{b}_pct": pct[b] for b in BOUNDS}, **{f"{b}_us": us[b] for b in BOUNDS},
            "top_events": [{"name": n, "device": d, "us": x, "pct": 100.0 * x / total if total else float("nan")}
                           for n, (x, d) in events],
            "notes": notes}
