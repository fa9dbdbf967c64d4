"""CPU call stacks of one rank, with each GPU kernel under the runtime call that launched it
(HTA 0.5.0's ``CallGraph`` / ``CallStackGraph``), as arrays.

Per CPU thread (pid, tid) the CPU events (stream -1) are nested by a walk over their start and
end points in HTA's order: by time; at one time ends of non-zero events before starts, starts
longest first, ends shortest first, zero-duration events nested in the order they appear
(:func:`event_order`). A start is a child of the innermost open event; an end closes the
innermost open event, whichever it is (HTA's walk, also for events that overlap without
nesting). Threads whose events all have stream > 0, or whose pid or tid is 0, are GPU streams
and get no stack. A kernel (stream > 0) is a child of the CPU event its correlation points to
(``index_correlation``). When the rank has exactly two threads labelled ``main`` (has a
``ProfilerStep#`` event) or ``bwd`` (has an ``autograd::`` event), the backward thread's
top-level events are moved under the first ``## backward ##`` annotation of the main thread
that spans them, or without such annotations under the ``ProfilerStep#`` that spans them.
Threads share a root when their tids have the same absolute value, as in HTA.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .model import RankView

ROOT = -1  # parent of a top-level event


@dataclass
class CallStacks:
    """Parent and depth of each event of ``v.ev`` (positions into its arrays).

    ``parent``: position of the parent event, ROOT for a top-level event, -2 for an event not
    in any stack (GPU events not linked to a launch, events of GPU threads). ``depth``: 0 for a
    top-level event, -1 outside the stacks (HTA's value for those rows)."""

    parent: np.ndarray
    depth: np.ndarray
    kernels: np.ndarray  # positions of the kernels linked to a launch (in the stacks)
    notes: list[str]


def _group_flags(group: np.ndarray, flag: np.ndarray, n_groups: int) -> np.ndarray:
    """Per group id: whether any member has ``flag``."""
    return np.bincount(group, weights=flag, minlength=n_groups) > 0


def event_order(thread: np.ndarray, ts: np.ndarray, dur: np.ndarray, index: np.ndarray):
    """HTA's order of start/end points (``_less_than``) as one lexsort, per thread.

    Returns (event, is_start) in walk order; ``event`` indexes the input arrays. At one time
    of one thread: ends of non-zero events (shortest first, then later event first) before
    starts of non-zero events (longest first, then earlier event first) when both occur;
    zero-duration events (starts by index, then ends by reverse index) after the starts and
    before the ends. HTA's own rules are not transitive when a zero-duration event meets both a
    start and an end at one time (its result then depends on its sort's input order); here the
    zero-duration events go after the starts, i.e. inside the event starting then.
    """
    n = len(ts)
    ev = np.concatenate([np.arange(n), np.arange(n)])
    start = np.concatenate((np.ones(n, bool), np.zeros(n, bool)))
    time = np.concatenate([ts, ts + dur])
    d = np.concatenate([dur, dur])
    idx = np.concatenate([index, index]).astype(np.int64)
    th = np.concatenate([thread, thread])
    zero = d == 0
    # groups of one (thread, time)
    o = np.lexsort((time, th))
    new = np.concatenate(([True], (th[o][1:] != th[o][:-1]) | (time[o][1:] != time[o][:-1])))
    gid = np.empty(2 * n, np.int64)
    gid[o] = np.cumsum(new) - 1
    n_groups = int(gid.max()) + 1 if n else 0
    both = _group_flags(gid, ~zero & start, n_groups) & _group_flags(gid, ~zero & ~start, n_groups)
    # class rank inside a group: starts (0), zero starts (1), zero ends (2), ends (3); ends first when both
    cls = np.where(zero, np.where(start, 1, 2), np.where(start, 0, 3))
    cls = np.where(both[gid] & ~zero & ~start, -1, cls)
    key_dur = np.where(zero, 0, np.where(start, -d, d))
    key_idx = np.where(start, idx, -idx)
    order = np.lexsort((key_idx, key_dur, cls, gid))
    return ev[order], start[order]


def _walk(seg: np.ndarray, is_start: np.ndarray) -> np.ndarray:
    """Parent (index into the walk, -1 for none) of each start of a start/end walk, segment by
    segment: the innermost open start, where an end closes the innermost open start and an end
    with nothing open is ignored (HTA's stack)."""
    m = len(is_start)
    parent = np.full(m, -1, np.int64)
    if not m:
        return parent
    step = np.where(is_start, 1, -1).astype(np.int64)
    seg_start = np.concatenate(([True], seg[1:] != seg[:-1]))
    seg_id = np.cumsum(seg_start) - 1
    c = np.cumsum(step)
    base = (c - step)[seg_start]  # the running sum before each segment
    c = c - base[seg_id]
    big = 2 * m + 2  # a segment's sums lie in [-m, m]: shifted segments never mix in the running min
    shifted = c - seg_id * big
    run_min = np.minimum.accumulate(shifted) + seg_id * big
    # the running min restarts with each segment (the previous segment's values are all larger)
    level_after = c - np.minimum(run_min, 0)
    starts = np.flatnonzero(is_start)
    level = level_after[starts] - 1  # stack size when this start is pushed
    # parent: the latest start of the same segment pushed at level - 1
    lv = level.max() + 2 if len(level) else 1
    key = (seg_id[starts] * lv + level) * (m + 1) + starts
    srt = np.argsort(key, kind="stable")
    skey = key[srt]
    want = (seg_id[starts] * lv + level - 1) * (m + 1) + starts
    j = np.searchsorted(skey, want) - 1
    ok = (level > 0) & (j >= 0)
    cand = starts[srt[np.maximum(j, 0)]]
    ok &= (skey[np.maximum(j, 0)] // (m + 1)) == (seg_id[starts] * lv + level - 1)
    parent[starts[ok]] = cand[ok]
    return parent


def _tid_abs(tid):
    return abs(tid) if isinstance(tid, int) else ("str", tid)


def build(v: RankView) -> CallStacks:
    """The call stacks of rank ``v`` over its analysed rows (HTA's ``CallGraph(t, ranks=[rank])``)."""
    ev = v.ev
    n = len(ev)
    notes: list[str] = []
    parent = np.full(n, -2, np.int64)
    depth = np.full(n, -1, np.int64)
    present = np.zeros(n, bool)
    present[v.rows] = True
    threads = ev.threads or [(0, 0)]
    thread = ev.thread if ev.thread is not None else np.zeros(n, np.int64)
    thread = thread.astype(np.int64)
    n_th = len(threads)
    pos = np.flatnonzero(present)
    th_present = _group_flags(thread[pos], np.ones(len(pos)), n_th)
    not_pos_stream = _group_flags(thread[pos], ev.stream[pos] <= 0, n_th)
    gpu_thread = np.array([(not not_pos_stream[t]) or threads[t][0] == 0 or threads[t][1] == 0
                           for t in range(n_th)], bool)
    node = present & (ev.stream == -1) & ~gpu_thread[thread]
    cpu = np.flatnonzero(node)
    dur = np.rint(ev.dur).astype(np.int64)
    if len(cpu):
        order_ev, order_start = event_order(thread[cpu], ev.ts[cpu], dur[cpu], ev.index[cpu])
        walk_parent = _walk(thread[cpu][order_ev], order_start)
        has = walk_parent >= 0
        parent[cpu[order_ev[order_start]]] = ROOT
        parent[cpu[order_ev[has]]] = cpu[order_ev[walk_parent[has]]]
    # roots: one per |tid| (HTA's root index -|tid|)
    root_key = {}
    root_of_thread = np.array([root_key.setdefault(_tid_abs(threads[t][1]), len(root_key)) for t in range(n_th)])
    _link_backward(v, parent, node, thread, threads, gpu_thread, th_present, root_of_thread, dur, notes)
    # kernels under their launch
    ic = v.index_correlation
    kern = np.flatnonzero(present & (ev.stream > 0) & (ic > 0))
    if len(kern):
        lp = np.searchsorted(ev.index, ic[kern])
        lp = np.minimum(lp, n - 1)
        ok = (ev.index[lp] == ic[kern]) & node[lp]
        kern, lp = kern[ok], lp[ok]
        parent[kern] = lp
    depth[:] = _depths(parent)
    return CallStacks(parent, depth, kern, notes)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of each event from its parent pointers (pointer doubling): 0 under ROOT, -1 outside."""
    depth = np.where(parent >= -1, 0, -1).astype(np.int64)
    up = np.where(parent >= 0, parent, -1)
    dist = (up >= 0).astype(np.int64)
    for _ in range(64):  # 2^64 levels: a loop left after that is a cycle
        i = np.flatnonzero(up >= 0)
        if not len(i):
            break
        dist[i] += dist[up[i]]
        up[i] = up[up[i]]
    else:
        depth[up >= 0] = -1
    return np.where(depth >= 0, dist, -1)


def _link_backward(v, parent, node, thread, threads, gpu_thread, th_present, root_of_thread, dur, notes) -> None:
    """HTA's ``_connect_stacks``: the backward thread's top-level events go under the main
    thread's annotation that spans them (in place on ``parent``)."""
    ev = v.ev
    names = ev.names
    main_ids = [i for i, s in enumerate(names) if s.startswith("ProfilerStep#")]
    bwd_ids = [i for i, s in enumerate(names) if "autograd::" in s]
    rows = v.rows
    labels = []
    order = sorted((t for t in range(len(threads)) if th_present[t] and not gpu_thread[t]),
                   key=lambda t: tuple((isinstance(x, str), x if isinstance(x, str) else int(x)) for x in threads[t]))
    # (numbers before text ids: a trace mixing int and text tids is sorted, not refused)
    row_th = thread[rows]
    for t in order:
        nm = ev.name[rows[row_th == t]]
        if np.isin(nm, main_ids).any():
            labels.append((t, "main"))
        elif np.isin(nm, bwd_ids).any():
            labels.append((t, "bwd"))
    if len(labels) != 2:
        return
    labels.sort(key=lambda x: x[1])  # stable: HTA's sort of two rows
    bwd_t, main_t = labels[0][0], labels[1][0]
    main_rows = rows[row_th == main_t]
    for prefix in ("## backward ##", "ProfilerStep#"):
        ids = [i for i, s in enumerate(names) if s.startswith(prefix)]
        annos = main_rows[np.isin(ev.name[main_rows], ids)]
        if len(annos):
            break
    else:
        return
    ts = ev.ts
    end = ts + dur
    top = np.flatnonzero((parent == ROOT) & node & (root_of_thread[thread] == root_of_thread[bwd_t]))
    for a in annos.tolist():
        if not node[a]:
            notes.append("a backward annotation is not a CPU op: backward thread left unlinked (HTA raises)")
            return
        moved = (ts[top] >= ts[a]) & (end[top] <= end[a]) & (top != a)
        if not moved.any():
            continue
        parent[top[moved]] = a
        top = top[~moved]
        if not len(top):  # HTA deletes the emptied root and goes on with the annotation's root
            r = a
            while parent[r] >= 0:
                r = int(parent[r])
            top = np.flatnonzero((parent == ROOT) & node & (root_of_thread[thread] == root_of_thread[thread[r]]))
