"""The peak table: every product NVML names, per dtype; MIG slices; unknown names; the agent's readings."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu import names as N
from otel_gpu import peaks
from otel_gpu.sources import fake_nvml
from otel_gpu.sources.fake_nvml import H100_MIG, FakeNvml
from otel_gpu.sources.nvml import NvmlSource

FAST = settings(max_examples=150, deadline=None)
T = 1e12

# (NVML product name, dtype) -> dense TFLOP/s from the datasheets (sparsity figures halved); None: no peak
EXPECTED = {
    "NVIDIA H100 80GB HBM3": {"fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979},
    "NVIDIA H100 PCIe": {"fp32": 51, "tf32": 378, "bf16": 756.5, "fp16": 756.5, "fp8": 1513},
    "NVIDIA H100 NVL": {"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "NVIDIA H200": {"fp32": 67, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979},
    "NVIDIA A100-SXM4-80GB": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "fp8": None},
    "NVIDIA A100-SXM4-40GB": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "fp8": None},
    "NVIDIA A100-PCIE-40GB": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "fp8": None},
    "NVIDIA A100 80GB PCIe": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "fp8": None},
    "NVIDIA L40S": {"fp32": 91.6, "tf32": 183, "bf16": 362.05, "fp16": 362.05, "fp8": 733},
    "NVIDIA L4": {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5},
    "NVIDIA A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125, "fp16": 125, "fp8": None},
    "Tesla V100-SXM2-32GB": {"fp32": 15.7, "tf32": None, "bf16": None, "fp16": 125, "fp8": None},
    "Tesla V100-PCIE-16GB": {"fp32": 14, "tf32": None, "bf16": None, "fp16": 112, "fp8": None},
    "NVIDIA B200": {"fp32": 75, "tf32": 1125, "bf16": 2250, "fp16": 2250, "fp8": 4500},
    "NVIDIA GB200": {"fp32": 80, "tf32": 1250, "bf16": 2500, "fp16": 2500, "fp8": 5000},
}
CASES = [(name, dtype, tf) for name, row in EXPECTED.items() for dtype, tf in row.items()]


@pytest.mark.parametrize("name,dtype,tflops", CASES, ids=[f"{n}-{d}" for n, d, _ in CASES])
def test_dense_peak_per_product_and_dtype(name, dtype, tflops):
    peak = peaks.peak_of(name)
    assert not peak.why_not and peak.device == name
    assert peak.flops.get(dtype) == (None if tflops is None else pytest.approx(tflops * T))
    rate, why = peak.rate(dtype)
    if dtype == "fp8":     # the hardware peak is exported; MFU under FP8 is not judged (as torchtitan)
        assert rate is None and why.startswith("not checked: no MFU under FP8")
    elif tflops is None:
        assert rate is None and why == f"not checked: {name} has no {dtype} peak (no {dtype} tensor cores)"
    else:
        assert rate == pytest.approx(tflops * T) and why == ""
    assert "http" in peak.basis and "dense" in peak.basis   # every row names its source


def test_every_row_cites_a_source_and_dense_is_below_tensor_sparse_figures():
    for p in peaks.PRODUCTS:
        assert p.source.count("https://") == 1, p.name
        assert set(p.tflops) <= set(peaks.DTYPES) and p.tflops["fp32"] > 0
        if "bf16" in p.tflops:
            assert p.tflops["fp16"] == p.tflops["bf16"] >= p.tflops["tf32"] >= p.tflops["fp32"], p.name
        if "fp8" in p.tflops:
            assert p.tflops["fp8"] == pytest.approx(2 * p.tflops["bf16"], rel=0.02), p.name


def test_the_fake_nvml_products_resolve():
    for make in (fake_nvml.hopper, fake_nvml.h200, fake_nvml.a100):
        assert not peaks.peak_of(make().name).why_not, make().name


@pytest.mark.parametrize("profile,share", [("1g.10gb", 1 / 7), ("2g.20gb", 2 / 7), ("3g.40gb", 3 / 7),
                                           ("4g.40gb", 4 / 7), ("7g.80gb", 1.0), ("1g.10gb+me", 1 / 7),
                                           ("1c.3g.40gb", 3 / 7)])
def test_a_mig_device_gets_its_share_of_the_sms(profile, share):
    peak = peaks.peak_of(f"NVIDIA H100 80GB HBM3 MIG {profile}")
    assert peak.flops["bf16"] == pytest.approx(989.5 * T * share)
    assert f"/7 (MIG {profile}" in peak.basis


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3 MIG 9g.90gb", "NVIDIA A100-SXM4-40GB MIG weird"])
def test_a_mig_profile_not_understood_is_not_checked(name):
    peak = peaks.peak_of(name)
    assert peak.why_not.startswith("not checked: MIG profile") and peak.rate("bf16")[0] is None


def _respell(rng_case, name):
    return " ".join(w.upper() if rng_case else w.lower() for w in name.split())


@FAST
@given(st.sampled_from(sorted(EXPECTED)), st.booleans(), st.text(" \t", min_size=0, max_size=3))
def test_lookup_ignores_case_and_spacing(name, upper, pad):
    spelled = pad + _respell(upper, name).replace(" ", " " + pad) + pad
    assert peaks.peak_of(spelled).flops == peaks.peak_of(name).flops != {}


@FAST
@given(st.text(max_size=200))
def test_any_other_name_is_not_checked_with_the_name_bounded_and_printable(name):
    if peaks.normalise(name) in {peaks.normalise(p.name) for p in peaks.PRODUCTS} or " mig " in f" {name.casefold()} ":
        return
    peak = peaks.peak_of(name)
    assert peak.flops == {} and peak.why_not.startswith("not checked: ")
    assert peak.why_not.endswith(" not in the peak table")
    shown = peak.why_not[len("not checked: "):-len(" not in the peak table")]
    assert len(shown) <= peaks.MAX_NAME and shown.isprintable()
    for dtype in peaks.DTYPES:
        assert peaks.peak_rate(name, dtype) == (None, peak.why_not)


def test_the_agent_reads_a_peak_per_dtype_for_each_gpu_and_mig_device():
    fake = FakeNvml(gpus=[fake_nvml.hopper(), fake_nvml.hopper(mig_devices=H100_MIG),
                          fake_nvml.a100(), fake_nvml.hopper(name="NVIDIA Mystery GPU")], costs={})
    src = NvmlSource(nvml=fake, cadence=False)
    try:
        got = {}
        for r in src.read():
            if r.spec is N.GPU_PEAK_FLOPS:
                got[(r.attributes[N.HW_NAME], r.attributes[N.DTYPE])] = r.value
                assert r.attributes[N.HW_ID]
        assert got[("NVIDIA H100 80GB HBM3", "bf16")] == pytest.approx(989.5 * T)
        assert got[("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "bf16")] == pytest.approx(989.5 * T * 3 / 7)
        assert got[("NVIDIA A100-SXM4-80GB", "tf32")] == pytest.approx(156 * T)
        assert ("NVIDIA A100-SXM4-80GB", "fp8") not in got
        assert not any(name == "NVIDIA Mystery GPU" for name, _ in got)   # not in the table: nothing exported
        assert {r.value for r in src.read() if r.spec is N.GPU_PEAK_FLOPS} == set(got.values())
    finally:
        src.close()



@FAST
@given(st.text(max_size=20), st.integers(1, 8), st.integers(1, 400), st.sampled_from(["", "+me", "+gfx"]))
def test_mig_profile_parser(junk, g, gb, ext):
    """Any text is a share in (0, 1] or None; a well-formed profile of g slices is g/7 (None beyond 7)."""
    share = peaks.mig_share(junk, 7)
    assert share is None or 0 < share <= 1
    want = g / 7 if g <= 7 else None
    assert peaks.mig_share(f"{g}g.{gb}gb{ext}", 7) == want
    assert peaks.mig_share(f"1c.{g}g.{gb}gb", 7) == want
