"""The critical-path graph: event start/end nodes, weighted edges, and the longest path with the
tie rules of networkx's ``dag_longest_path`` (which HTA 0.5.0 uses). Times are microseconds."""
from __future__ import annotations

SPAN, DEPENDENCY, LAUNCH, KERNEL_GAP, SYNC = range(5)  # edge types


class CriticalPathError(Exception):
    """The rank's graph cannot give a critical path (HTA raises or returns nothing here)."""


class Graph:
    """Nodes (event start/end) and weighted edges, in insertion order (ties follow it)."""

    def __init__(self, node_ts: list[float]):
        self.ts = node_ts
        self.edges: dict[tuple[int, int], tuple] = {}  # (u, v) -> (graph weight, own weight, type, event)
        self.syncs: list[tuple[int, int]] = []

    def add(self, u: int, v: int, kind: int = SPAN, zero: bool = False, event: int | None = None) -> None:
        """An edge; its weight is the time between its nodes (0 for dependencies, syncs and ``zero``);
        a weight of -1 us or less (rounding) counts 0 for the path, its own value for the summary."""
        if kind == DEPENDENCY or kind == SYNC or zero:
            w = 0.0
            if kind == SYNC:
                self.syncs.append((u, v))
        else:
            w = self.ts[v] - self.ts[u]
        self.edges[(u, v)] = (0.0 if w <= -1 else w, w, kind, event)

    def longest_path(self) -> list[tuple[int, int]]:
        """Edges of the longest path: nodes taken in topological order by generations (nodes in id
        order, successors in edge order), each node's best predecessor the first of the largest
        distance (negative: none), the path ending at the first node of the largest distance."""
        n = len(self.ts)
        succ: list[list[int]] = [[] for _ in range(n)]
        pred: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        indeg = [0] * n
        for (u, v), e in self.edges.items():
            succ[u].append(v)
            pred[v].append((u, e[0]))
            indeg[v] += 1
        dist = [0.0] * n
        back = list(range(n))
        end, end_d, seen = -1, float("-inf"), 0
        gen = [i for i in range(n) if not indeg[i]]
        while gen:
            seen += len(gen)
            nxt = []
            for v in gen:
                pv = pred[v]
                if pv:
                    bu, bd = pv[0][0], dist[pv[0][0]] + pv[0][1]
                    for u, w in pv:
                        d = dist[u] + w
                        if d > bd:
                            bu, bd = u, d
                    if bd >= 0:
                        dist[v], back[v] = bd, bu
                if dist[v] > end_d:
                    end, end_d = v, dist[v]
                for x in succ[v]:
                    indeg[x] -= 1
                    if not indeg[x]:
                        nxt.append(x)
            gen = nxt
        if seen != n:
            raise CriticalPathError("the event graph has a cycle (events overlap in an impossible way)")
        path = []
        v = end
        while v >= 0 and back[v] != v:
            path.append((back[v], v))
            v = back[v]
        return path[::-1]
