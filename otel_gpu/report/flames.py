"""Flame graph trees of a recording's profiles, per rank and phase, for the report."""
from __future__ import annotations

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


def flames(rec: Recording, min_share: float = MIN_FLAME_SHARE, max_nodes: int = MAX_FLAME_NODES) -> dict:
    """Per "rank|phase" a flame graph tree `[name index, total value, [children]]` (values in the
    profile's unit, nanoseconds for pyroscope-io), the smallest frames left out (`_floor`: their
    time stays in their parent's total); `names` is the shared frame-name table."""
    trees: dict[str, dict] = {}
    unit = ""
    hosts = {labels.get("node", "") for _, _, labels, _ in rec.profile_stacks()}
    for stack, value, labels, u in rec.profile_stacks():
        unit = unit or u
        rank = labels.get("rank", "?")
        if len(hosts) > 1:
            rank = f"{labels.get('node', '')} rank {rank}"
        key = f"{rank}|{labels.get('phase') or NO_PHASE}"
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
    names: dict[str, int] = {}

    def pack(name: str, node: dict, floor: float) -> list:
        kept = sorted(((k, c) for k, c in node["c"].items() if c["v"] >= floor), key=lambda kv: -kv[1]["v"])
        return [names.setdefault(name, len(names)), node["v"], [pack(k, c, floor) for k, c in kept]]

    packed = {k: pack("total", t, _floor(t, min_share, max_nodes)) for k, t in trees.items()}
    ranks = sorted({k.split("|")[0] for k in packed}, key=_num_key)
    phases = sorted({k.split("|")[1] for k in packed}, key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else 99, p))
    return {"unit": unit or "nanoseconds", "names": list(names), "ranks": ranks, "phases": phases, "trees": packed}


