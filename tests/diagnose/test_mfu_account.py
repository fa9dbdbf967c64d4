"""MFU per rank and job, and the account from 100% of the wall time down to MFU, over hand-built windows."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.diagnose.account import account, headline, summary
from otel_gpu.diagnose.mfu import NO_GPU, job_work
from otel_gpu.peaks import peak_of

from .windows import gpu, rank, window

FAST = settings(max_examples=200, deadline=None)
H100 = "NVIDIA H100 80GB HBM3"
WALL = 120.0   # every rank's wall time in these windows


def _h100(i: int, **kw):
    kw.setdefault("model", H100)
    kw.setdefault("peaks", dict(peak_of(H100).flops))
    return gpu(i, **kw)


def _rank(i: int, mfu: float = 0.3, dtype: str = "bf16", peak: float = 989.5e12, **phases):
    r = rank(i, **phases)
    r.flops, r.flops_basis, r.tokens, r.compute_dtype = mfu * peak * WALL, "6N+attention", 1000.0 * WALL, dtype
    return r


def test_mfu_per_rank_and_job_against_the_gpus_dense_peak_and_beside_tensor_activity():
    w = window([_rank(0, 0.30), _rank(1, 0.20)], [_h100(0, tensor=0.6), _h100(1, tensor=0.6)])
    job = job_work(w)
    assert [x.mfu for x in job.ranks] == [pytest.approx(0.30), pytest.approx(0.20)]
    assert job.ranks[0].flops_per_s == pytest.approx(0.3 * 989.5e12) and job.ranks[0].gpu == "n0/gpu0"
    assert job.mfu == pytest.approx(0.25) and job.mfu_ranks == 2
    assert job.flops_per_s_per_gpu == pytest.approx(0.25 * 989.5e12)
    assert job.tokens_per_s == pytest.approx(2000.0)
    assert "bf16" in job.basis and H100 in job.basis
    assert job.beside_tensor().startswith("tensor activity 60.0%, MFU 25.0%: the tensor pipes are busy with work")
    w.gpus[0].tensor = w.gpus[1].tensor = 0.27
    assert job_work(w).beside_tensor() == "tensor activity 27.0%, MFU 25.0%"


def test_a_mig_slice_is_judged_against_its_share():
    mig = "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    w = window([_rank(0, 0.3, peak=989.5e12 * 3 / 7)], [_h100(0, model=mig, peaks=dict(peak_of(mig).flops))])
    assert job_work(w).mfu == pytest.approx(0.3)


@pytest.mark.parametrize("case,why", [
    ("fp8", "not checked: no MFU under FP8"),
    ("v100_bf16", "not checked: Tesla V100-SXM2-32GB has no bf16 peak"),
    ("unknown_gpu", "not checked: NVIDIA Mystery not in the peak table"),
    ("no_dtype", "not checked: the compute dtype was not seen"),
    ("not_on_gpu", "not checked: rank 0 was not seen on a GPU"),
    ("no_flops", "not checked: no model FLOPs exported"),
    ("cpu", NO_GPU),
])
def test_what_cannot_be_judged_says_why(case, why):
    r = _rank(0, dtype="fp8" if case == "fp8" else "" if case == "no_dtype" else "bf16")
    g = _h100(0)
    if case == "v100_bf16":
        g = gpu(0, model="Tesla V100-SXM2-32GB", peaks=dict(peak_of("Tesla V100-SXM2-32GB").flops))
    elif case == "unknown_gpu":
        g = gpu(0, model="NVIDIA Mystery", peaks={})
    elif case == "not_on_gpu":
        g.ranks = []
    elif case == "no_flops":
        r.flops = None
    job = job_work(window([r], [] if case == "cpu" else [g]))
    assert job.mfu is None and job.ranks[0].mfu is None
    assert job.ranks[0].why_not.startswith(why) and job.why_not.startswith(why)
    acc = account(window([r], [] if case == "cpu" else [g]))
    assert sum(p.share for p in acc.parts) == pytest.approx(1.0)


def test_the_account_from_wall_time_down_to_mfu():
    r = _rank(0, 0.25, waits={"backward": 6.0, "": 6.0, "checkpoint": 1.2},
              data_wait=12.0, forward=30.0, backward=30.0, optimizer=12.0, checkpoint=6.0, eval=0.0)
    acc = account(window([r], [_h100(0, util=0.5)]))
    got = {p.key: p.share for p in acc.parts}
    assert got["data_wait"] == pytest.approx(0.10) and got["communication"] == pytest.approx(0.10)
    assert got["checkpoint"] == pytest.approx(0.06) and got["eval"] == 0.0
    compute = 72.0 / WALL
    assert got["unphased"] == pytest.approx(1 - 0.10 - 0.10 - 0.06 - compute)
    assert got["gpu_idle"] == pytest.approx(compute - 0.5)
    assert got["mfu"] == pytest.approx(0.25) and got["gpu_below_peak"] == pytest.approx(0.25)
    assert sum(got.values()) == pytest.approx(1.0)
    assert [p.key for p in acc.parts][-1] == "mfu" and "dense bf16 peak" in acc.parts[-1].basis
    assert any(line.startswith("MFU") for line in acc.lines())


def test_a_sleepy_loader_over_100_percent_is_scaled_and_said():
    r = _rank(0, 0.01, data_wait=WALL * 1.001, forward=0.6)   # counters read at the edges: 100.1% + compute
    acc = account(window([r], [_h100(0, util=0.004)]))
    got = {p.key: p.share for p in acc.parts}
    assert 0.99 < got["data_wait"] < 1.0 and got["unphased"] == 0.0
    assert sum(got.values()) == pytest.approx(1.0)
    assert any("add up to 100.6% of the wall time" in n and "scaled by" in n for n in acc.notes), acc.notes


def test_gpu_timed_collectives_are_not_charged_and_that_is_said():
    r = _rank(0, waits={"": 30.0}, forward=40.0, backward=40.0)
    r.collective_basis = "gpu"
    acc = account(window([r], [_h100(0)]))
    assert next(p.share for p in acc.parts if p.key == "communication") == 0.0
    assert any("GPU-timed" in n for n in acc.notes)


def test_a_cpu_job_keeps_its_compute_unsplit_and_its_rate_is_per_rank():
    w = window([_rank(0, data_wait=60.0, forward=30.0)])
    acc = account(w)
    assert acc.parts[-1].key == "compute" and "no GPU" in acc.parts[-1].basis
    assert sum(p.share for p in acc.parts) == pytest.approx(1.0)
    line = headline(summary(w)["job"])
    assert line == "297 TFLOP/s per rank, 1000 tokens/s, MFU not checked: no GPU", line
    on_gpu = headline(summary(window([_rank(0)], [_h100(0, tensor=None)]))["job"])
    assert on_gpu == "297 TFLOP/s per GPU, 1000 tokens/s, MFU 30.0%", on_gpu


phase_s = st.floats(0, 200, allow_nan=False)


@FAST
@given(data=phase_s, fwd=phase_s, bwd=phase_s, opt=phase_s, ckpt=phase_s, ev=phase_s, own=phase_s, wait=phase_s,
       util=st.none() | st.floats(0, 1), mfu=st.floats(0, 1.5), basis=st.sampled_from(["host", "gpu", "mixed", ""]),
       gpus=st.booleans())
def test_the_parts_always_add_up_to_the_wall_time_and_none_is_negative(data, fwd, bwd, opt, ckpt, ev, own, wait, util,
                                                                       mfu, basis, gpus):
    r = _rank(0, mfu, waits={"backward": wait, "eval": wait / 2}, data_wait=data, forward=fwd, backward=bwd,
              optimizer=opt, checkpoint=ckpt, eval=ev, setup=own)
    r.collective_basis = basis
    acc = account(window([r], [_h100(0, util=util)] if gpus else []))
    shares = [p.share for p in acc.parts]
    assert sum(shares) == pytest.approx(1.0, abs=1e-9) and min(shares) >= -1e-12, acc.as_dict()


counts = st.floats(0, 1e18, allow_nan=False)


@FAST
@given(flops=st.dictionaries(st.sampled_from(["6N+attention", "measured", ""]), st.tuples(counts, st.none() | counts)),
       tokens=st.none() | st.tuples(counts, st.none() | counts), dtypes=st.sets(st.sampled_from(["bf16", "fp32", "fp8"])),
       peaks=st.dictionaries(st.sampled_from(["bf16", "fp8", ""]), st.none() | st.floats(-1, 1e16, allow_nan=False)))
def test_the_summary_values_parse_into_rank_and_gpu_fields(flops, tokens, dtypes, peaks):
    """work_inputs / peak_inputs over what the union query tags: counter increases never negative, a dtype only
    when one was seen, peaks only positive and labelled."""
    from otel_gpu.diagnose.work import peak_inputs, work_inputs
    v = {}
    for basis, (last, start) in flops.items():
        v[f"flops_{basis}"] = last
        if start is not None:
            v[f"flops0_{basis}"] = start
    if tokens is not None:
        v["tokens"], v["tokens0"] = tokens
    v.update({f"dtype_{d}": 1.0 for d in dtypes})
    got = work_inputs(v)
    if flops:
        assert got["flops"] == pytest.approx(sum(max(0.0, a - (b or 0.0)) for a, b in flops.values()))
        assert got["flops_basis"] == "+".join(sorted(flops))
    else:
        assert got["flops"] is None and got["flops_basis"] == ""
    assert got["tokens"] == (None if tokens is None else max(0.0, tokens[0] - (tokens[1] or 0.0)))
    assert got["compute_dtype"] == (next(iter(dtypes)) if len(dtypes) == 1 else "")
    want = {d: x for d, x in peaks.items() if d and x is not None and x > 0}
    assert peak_inputs({f"peak_{d}": x for d, x in peaks.items()}) == want
