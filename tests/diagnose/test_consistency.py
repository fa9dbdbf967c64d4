"""The job consistency check: GPUs of one job that differ in model, memory or PCIe link are named
(hand-built windows, the PromQL summary's parsing, Hypothesis over which GPUs are odd)."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose import RULES
from otel_gpu.diagnose.consistency import common_value, gpu_consistency, odd_gpus
from otel_gpu.diagnose.parse import parse_gpus
from otel_gpu.diagnose.queries import Q
from otel_gpu.diagnose.thresholds import Thresholds
from otel_gpu.promql import Series

from .windows import gpu, window

H100 = dict(model="NVIDIA H100 80GB HBM3", mem_limit_b=81559 * 2**20, pcie_gen=5.0, pcie_width=16.0)


def test_alike_gpus_give_nothing_and_unknown_properties_are_not_compared():
    assert gpu_consistency(window(gpus=[gpu(i, **H100) for i in range(8)]), Thresholds()) == []
    assert gpu_consistency(window(gpus=[gpu(0), gpu(1)]), Thresholds()) == []   # no model, no link: nothing said
    assert gpu_consistency(window(gpus=[gpu(0, **H100)]), Thresholds()) == []   # one GPU: nothing to compare
    assert gpu_consistency in RULES


def test_odd_link_and_model_are_named_against_the_common_value():
    gpus = [gpu(i, host=f"n{i // 4}", **H100) for i in range(8)]
    gpus[5] = gpu(5, host="n1", **{**H100, "pcie_gen": 3.0, "pcie_width": 4.0})
    gpus[6] = gpu(6, host="n1", **{**H100, "model": "NVIDIA A100-SXM4-80GB", "mem_limit_b": 81920 * 2**20})
    findings = {f.evidence["property"]: f for f in gpu_consistency(window(gpus=gpus), Thresholds())}
    assert set(findings) == {"model", "memory (GiB)", "PCIe generation", "PCIe width (lanes)"}
    assert findings["PCIe generation"].where == {"gpus": ["n1/gpu5"]}
    assert findings["PCIe generation"].evidence == {"property": "PCIe generation", "common": 5, "odd": {"n1/gpu5": 3}}
    assert "n1/gpu5 4" in findings["PCIe width (lanes)"].seen and "not 16" in findings["PCIe width (lanes)"].title
    assert findings["model"].where == {"gpus": ["n1/gpu6"]} and findings["memory (GiB)"].evidence["odd"] == {"n1/gpu6": 80.0}
    assert all(f.severity == "warning" and f.lost_s == 0 for f in findings.values())


def test_ties_name_the_slower_half():
    assert common_value([3, 5, 5, 3]) == 5 and common_value(["b", "a"]) == "a"
    gpus = [gpu(0, pcie_width=16.0), gpu(1, pcie_width=8.0)]
    assert odd_gpus(gpus) == {"PCIe width (lanes)": (16, {"n0/gpu1": 8})}


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 16), st.data())
def test_the_odd_ones_are_exactly_those_unlike_the_majority(n, data):
    odd = data.draw(st.sets(st.integers(0, n - 1), max_size=(n - 1) // 2))
    gens = [3.0 if i in odd else 5.0 for i in range(n)]
    got = odd_gpus([gpu(i, pcie_gen=g) for i, g in enumerate(gens)])
    assert got == ({"PCIe generation": (5, {f"n0/gpu{i}": 3 for i in odd})} if odd else {})


def test_the_summary_query_feeds_model_and_link():
    def s(q, value, **labels):
        return Series({"host_name": "n0", "hw_id": "GPU-a", "otelgpu_gpu_index": "0", Q: q, **labels},
                      [(1.7e9, value)])
    (g,) = parse_gpus([s("n", 10), s("model_NVIDIA H100 80GB HBM3", 1e9, hw_name="NVIDIA H100 80GB HBM3"),
                       s("pcie_gen", 4), s("pcie_width", 16), s("mem_limit", 85520809984)])
    assert (g.model, g.pcie_gen, g.pcie_width) == ("NVIDIA H100 80GB HBM3", 4, 16)


def test_the_summary_query_feeds_clock_limit_and_driver():
    def s(q, value, **labels):
        return Series({"host_name": "n0", "hw_id": "GPU-a", "otelgpu_gpu_index": "0", Q: q, **labels},
                      [(1.7e9, value)])
    (g,) = parse_gpus([s("n", 10), s("clock_limit", 1.98e9), s("driver_590.48.01", 1, otelgpu_driver_version="590.48.01")])
    assert (g.sm_clock_limit_hz, g.driver) == (1.98e9, "590.48.01")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["590.48.01", "580.95.05", "575.57.08"]), min_size=2, max_size=12),
       st.lists(st.sampled_from([1410, 1755, 1980]), min_size=2, max_size=12))
def test_driver_and_clock_odd_ones_are_those_unlike_the_common_value(drivers, clocks):
    n = min(len(drivers), len(clocks))
    gpus = [gpu(i, driver=drivers[i], sm_clock_limit_hz=clocks[i] * 1e6) for i in range(n)]
    got = odd_gpus(gpus)
    for key, values in (("driver", drivers[:n]), ("max SM clock (MHz)", clocks[:n])):
        if len(set(values)) == 1:
            assert key not in got
            continue
        common, odd = got[key]
        assert values.count(common) == max(values.count(v) for v in values)
        assert odd == {f"n0/gpu{i}": v for i, v in enumerate(values) if v != common}
