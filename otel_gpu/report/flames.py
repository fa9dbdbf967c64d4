"""Flame graph trees of a recording's profiles, per rank and phase, for the report.

The user's program and otel-gpu's own threads (otel_gpu.profile_threads.is_own) go to separate
trees: the page shows the first, and the second only when asked. Time in a thread with no Python
frame (native code) gets one frame named after its thread, e.g. "pt_autograd_0 (native: backward
kernels)", instead of an empty block.
"""
from __future__ import annotations

from ..profile_threads import THREAD_ID, THREAD_NAME, is_own, native_label, thread_names
from ..record.reader import Recording
from .data import PHASE_ORDER, _num_key

MIN_FLAME_SHARE = 0.001   # flame graph frames under this share of their tree's total are left out
MAX_FLAME_NODES = 1500    # and at most this many frames per rank and phase (the largest kept)
NO_PHASE = "(no phase)"


def _floor(tree: dict, min_share: float, max_nodes: int) -> float:
    """The smallest frame total kept: `min_share` of the tree, raised so at most `max_nodes` frames stay
    (a child never outweighs its parent, so what is kept stays one connected tree)."""
    values, todo = [], [tree]
    while todo:
        node = todo.pop()
        values.append(node["v"])
        todo += node["c"].values()
    floor = tree["v"] * min_share
    if len(values) > max_nodes:
        floor = max(floor, sorted(values, reverse=True)[max_nodes - 1])
    return floor


def _add(trees: dict, key: str, stack, value: int) -> None:
    node = trees.get(key)
    if node is None:
        node = trees[key] = {"v": 0, "c": {}}
    node["v"] += value
    for frame in stack:
        kids = node["c"]
        node = kids.get(frame)
        if node is None:
            node = kids[frame] = {"v": 0, "c": {}}
        node["v"] += value


def flames(rec: Recording, min_share: float = MIN_FLAME_SHARE, max_nodes: int = MAX_FLAME_NODES) -> dict:
    """Per "rank|phase" a flame graph tree `[name index, total value, [children]]` (values in the
    profile's unit, nanoseconds for pyroscope-io), the smallest frames left out (`_floor`: their
    time stays in their parent's total); `names` is the shared frame-name table. `trees` holds the
    user's program, `own_trees` otel-gpu's own threads; `native` lists the name indices of the
    frames that stand for a thread in native code."""
    trees: dict[str, dict] = {}
    own_trees: dict[str, dict] = {}
    unit = ""
    rows = rec.profile_stacks()
    hosts = {labels.get("node", "") for _, _, labels, _ in rows}
    named = thread_names(((labels.get("node"), labels.get("rank")), labels) for _, _, labels, _ in rows)
    native: set[str] = set()
    for stack, value, labels, u in rows:
        unit = unit or u
        rank = labels.get("rank", "?")
        if len(hosts) > 1:
            rank = f"{labels.get('node', '')} rank {rank}"
        key = f"{rank}|{labels.get('phase') or NO_PHASE}"
        if is_own(stack, labels):
            _add(own_trees, key, stack, value)
            continue
        if not stack:
            name = labels.get(THREAD_NAME) or named.get(((labels.get("node"), labels.get("rank")), labels.get(THREAD_ID)))
            stack = [native_label(name)]
            native.add(stack[0])
        _add(trees, key, stack, value)
    names: dict[str, int] = {}

    def pack(name: str, node: dict, floor: float) -> list:
        kept = sorted(((k, c) for k, c in node["c"].items() if c["v"] >= floor), key=lambda kv: -kv[1]["v"])
        return [names.setdefault(name, len(names)), node["v"], [pack(k, c, floor) for k, c in kept]]

    packed = {k: pack("total", t, _floor(t, min_share, max_nodes)) for k, t in trees.items()}
    own = {k: pack("total", t, _floor(t, min_share, max_nodes)) for k, t in own_trees.items()}
    keys = set(packed) | set(own)
    ranks = sorted({k.split("|")[0] for k in keys}, key=_num_key)
    phases = sorted({k.split("|")[1] for k in keys}, key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else 99, p))
    return {"unit": unit or "nanoseconds", "names": list(names), "ranks": ranks, "phases": phases, "trees": packed,
            "own_trees": own, "native": sorted(names[n] for n in native if n in names)}
