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


def _pack(tree: dict, floor: float, names: dict[str, int]) -> list[int]:
    """The tree in preorder as one flat list, three numbers a frame: its name's index in `names`
    (added on first use), its total value, its number of children kept (largest first; frames under
    `floor` left out). Flat and built without recursion: a stack thousands of frames deep (a recursive
    job) is neither a RecursionError here nor a nesting too deep for the JSON encoder."""
    out: list[int] = []
    todo = [("total", tree)]
    while todo:
        name, node = todo.pop()
        kept = sorted(((k, c) for k, c in node["c"].items() if c["v"] >= floor), key=lambda kv: -kv[1]["v"])
        out += (names.setdefault(name, len(names)), node["v"], len(kept))
        todo += reversed(kept)   # the largest child is taken next
    return out


def flames(rec: Recording, min_share: float = MIN_FLAME_SHARE, max_nodes: int = MAX_FLAME_NODES) -> dict:
    """Per "rank|phase" a flame graph tree as a flat preorder list (`_pack`: name index, total value,
    number of children, per frame; values in the profile's unit, nanoseconds for pyroscope-io), the
    smallest frames left out (`_floor`: their time stays in their parent's total); `names` is the
    shared frame-name table. `trees` holds the
    user's program, `own_trees` otel-gpu's own threads; `native` lists the name indices of the
    frames that stand for a thread in native code. `ranks` and `phases` name the keys' two halves
    (a name may hold "|": the page looks keys up from these, it never splits them)."""
    trees: dict[tuple[str, str], dict] = {}
    own_trees: dict[tuple[str, str], dict] = {}
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
        key = (rank, labels.get("phase") or NO_PHASE)
        if is_own(stack, labels):
            _add(own_trees, key, stack, value)
            continue
        if not stack:
            name = labels.get(THREAD_NAME) or named.get(((labels.get("node"), labels.get("rank")), labels.get(THREAD_ID)))
            stack = [native_label(name)]
            native.add(stack[0])
        _add(trees, key, stack, value)
    names: dict[str, int] = {}
    packed = {f"{r}|{p}": _pack(t, _floor(t, min_share, max_nodes), names) for (r, p), t in trees.items()}
    own = {f"{r}|{p}": _pack(t, _floor(t, min_share, max_nodes), names) for (r, p), t in own_trees.items()}
    keys = set(trees) | set(own_trees)
    ranks = sorted({r for r, _ in keys}, key=_num_key)
    phases = sorted({p for _, p in keys}, key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else 99, p))
    return {"unit": unit or "nanoseconds", "names": list(names), "ranks": ranks, "phases": phases, "trees": packed,
            "own_trees": own, "native": sorted(names[n] for n in native if n in names)}


GPU_PHASE = "GPU time by launching code (trace)"


def add_gpu_time(doc: dict, per_rank: dict, min_share: float = MIN_FLAME_SHARE,
                 max_nodes: int = MAX_FLAME_NODES) -> dict:
    """Add GPU time by launching code to `flames`' result, in place, as one more phase (`GPU_PHASE`) of
    each rank: ``per_rank`` maps a rank to its folded stacks (frames root first -> GPU time in ns), as
    ``otel_gpu.trace.gpu_flame.trace_dir_stacks(trace_dir)`` gives them for a run's captured traces.
    The page then shows it beside the CPU flame graph of the same rank (both in nanoseconds)."""
    names = {n: i for i, n in enumerate(doc["names"])}
    for rank, stacks in sorted(per_rank.items()):
        trees: dict = {}
        for stack, ns in stacks.items():
            if ns > 0:
                _add(trees, "gpu", stack, ns)
        if trees:
            tree = trees["gpu"]
            doc["trees"][f"{rank}|{GPU_PHASE}"] = _pack(tree, _floor(tree, min_share, max_nodes), names)
            if str(rank) not in doc["ranks"]:
                doc["ranks"] = sorted(doc["ranks"] + [str(rank)], key=_num_key)
            if GPU_PHASE not in doc["phases"]:
                doc["phases"].append(GPU_PHASE)
    doc["names"] = list(names)
    doc["gpu_phase"] = GPU_PHASE   # the page leaves it out of "all" phases (CPU samples) and names it GPU time
    return doc

