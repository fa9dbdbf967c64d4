"""The run report's flame data gains GPU time by launching code as its own phase per rank: the same
packed trees the page draws, totals equal to the stacks' GPU time, kept out of the CPU samples."""
from __future__ import annotations

from otel_gpu.report.flames import GPU_PHASE, add_gpu_time


def unpack(flat: list[int], names: list[str]) -> dict:
    """The page's unpack (page.js), in Python: name, value, children."""
    root = {"name": names[flat[0]], "value": flat[1], "children": []}
    open_ = [[root, flat[2]]]
    for i in range(3, len(flat), 3):
        while open_[-1][1] == 0:
            open_.pop()
        open_[-1][1] -= 1
        node = {"name": names[flat[i]], "value": flat[i + 1], "children": []}
        open_[-1][0]["children"].append(node)
        open_.append([node, flat[i + 2]])
    return root


def test_gpu_time_is_a_phase_of_each_rank_beside_the_cpu_trees():
    cpu = {"unit": "nanoseconds", "names": ["total", "main"], "ranks": ["0"], "phases": ["forward"],
           "trees": {"0|forward": [0, 5, 1, 1, 5, 0]}, "own_trees": {}, "native": []}
    per_rank = {0: {("step", "aten::mm", "gemm"): 700, ("step", "[nccl]", "nccl_kernel"): 300},
                3: {("main", "[memcpy HtoD]", "Memcpy HtoD"): 50}, 5: {}}
    doc = add_gpu_time(cpu, per_rank)
    assert doc["ranks"] == ["0", "3"] and doc["phases"] == ["forward", GPU_PHASE] and doc["gpu_phase"] == GPU_PHASE
    assert doc["trees"]["0|forward"] == [0, 5, 1, 1, 5, 0]    # the CPU tree and its names untouched
    assert doc["names"][:2] == ["total", "main"]
    t0 = unpack(doc["trees"][f"0|{GPU_PHASE}"], doc["names"])
    assert t0["name"] == "total" and t0["value"] == 1000
    (step,) = t0["children"]
    assert {c["name"]: c["value"] for c in step["children"]} == {"aten::mm": 700, "[nccl]": 300}
    t3 = unpack(doc["trees"][f"3|{GPU_PHASE}"], doc["names"])
    assert t3["children"][0]["name"] == "main" and t3["value"] == 50   # a frame named as a CPU one shares its name
    assert f"5|{GPU_PHASE}" not in doc["trees"]
