"""Findings across ranks: grouped, linked cause -> effect, filtered by time at stake, true labels,
and the 64-rank one-screen output."""
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from otel_gpu.cli import main
from otel_gpu.trace.analyze import Options, analyze
from otel_gpu.trace.diff import diff_sets
from otel_gpu.trace.findings import Thresholds
from otel_gpu.trace.grouping import rank_ranges
from otel_gpu.trace.model import load_set
from otel_gpu.trace.report import render_findings
from kineto import Builder, stall_trace


@pytest.fixture(scope="module")
def run64(tmp_path_factory):
    """64 ranks: cudaFree thrash draining the GPU everywhere, launch-bound kernels on ranks 0-31."""
    d = tmp_path_factory.mktemp("run64")
    for r in range(64):
        stall_trace(r, free_calls=12 + r % 5, short_kernels=r < 32).write(str(d / f"rank{r}.json"))
    return d


@pytest.fixture(scope="module")
def doc64(run64):
    return analyze(load_set(str(run64)))


def test_64_ranks_findings_fit_one_screen_and_name_the_ranks(run64, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")   # a wide terminal: the line count below is for 160 columns
    out = tmp_path / "o.json"
    assert main(["trace", "analyze", str(run64), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    section = text[text.index("Findings"):].splitlines()
    assert len(section) <= 25, "\n".join(section)  # a screen is ~50 lines; 6 patterns would still fit
    assert all(len(line) <= 160 for line in section)
    assert "ranks 0-31 (32 of 64)" in text and "ranks 0-63 (64 of 64)" in text
    assert text.count("Long GPU idle time") == 1  # the effect is printed once, under its cause
    assert len(text.splitlines()) <= 200  # per-rank tables show the notable ranks only past 16 ranks
    assert "8 of 64 ranks" in text  # the table titles say which ranks are shown
    doc = json.loads(out.read_text())
    assert len(doc["findings"]) == 3 and len(doc["checks"]) == 64 * 10  # 10 checks per rank


def test_grouped_with_spread_and_worst_rank(doc64):
    f = {x["pattern"]: x for x in doc64["findings"]}
    alloc = f["alloc_thrash"]
    assert alloc["ranks"] == list(range(64)) and alloc["ranks_text"] == "0-63"
    # 12 + r % 5 cudaFree per step: 12 to 16, 25 us each, steps 2 and 3 (after the first analysed)
    assert (alloc["indicator"]["min"], alloc["indicator"]["max"]) == (12, 16)
    assert alloc["time_at_stake_per_rank_us"]["max"] == 16 * 25 * 2 and alloc["worst_rank"] in (4, 9, 14)
    assert f["many_short_kernels"]["ranks"] == list(range(32))


def test_idle_linked_to_its_causes(doc64):
    f = {x["pattern"]: x for x in doc64["findings"]}
    idle = f["long_gpu_idle"]
    assert [c["pattern"] for c in idle["caused_by"]] == ["alloc_thrash", "many_short_kernels"]
    # per step 2.9 ms of the ~4 ms idle begins inside a cudaFree
    assert idle["caused_by"][0]["share_of_idle_pct"] > 45
    assert f["alloc_thrash"]["leads_to"][0]["pattern"] == "long_gpu_idle"


def test_time_at_stake_threshold_is_overridable(run64):
    ts = load_set(str(run64), ranks=[0, 1, 40])
    strict = analyze(ts, Options(thresholds=Thresholds(min_time_share_pct=10)))  # launch-bound: 9.3% at stake
    assert [f["pattern"] for f in strict["findings"]] == ["long_gpu_idle"]
    assert strict["findings"][0]["caused_by"] == []  # its causes are no longer findings
    alloc = [c for c in strict["checks"] if c["pattern"] == "alloc_thrash"]
    assert all(c["triggered"] and not c["reported"] for c in alloc)


def test_ranks_over_threshold_with_little_at_stake_are_named(run64):
    ts = load_set(str(run64), ranks=[0, 1, 2])
    # ranks 0-2 carry 12, 13, 14 frees a step: 600, 650, 700 us at stake of a 29.8 ms span (2.01, 2.18, 2.35%)
    doc = analyze(ts, Options(thresholds=Thresholds(min_time_share_pct=2.1)))
    (alloc,) = [f for f in doc["findings"] if f["pattern"] == "alloc_thrash"]
    assert alloc["ranks"] == [1, 2] and alloc["ranks_triggered_below_min_share"] == [0]


def test_label_says_when_there_are_no_steps(tmp_path):
    b = stall_trace(0)
    b.events = [e for e in b.events if not str(e.get("name", "")).startswith("ProfilerStep")]
    b.write(str(tmp_path / "r.json"))
    doc = analyze(load_set(str(tmp_path)))
    labels = {c["pattern"]: c["indicator"] for c in doc["checks"]}
    assert labels["alloc_thrash"] == "malloc/free calls in the trace (no ProfilerStep)"
    assert labels["too_many_syncs"] == "user host syncs in the trace (no ProfilerStep)"
    assert "per step" not in json.dumps(doc["findings"])


def test_sync_waiting_for_nccl_is_not_at_stake(tmp_path):
    b = Builder(0)
    b.launch("aten::mm", "ampere_sgemm_128x64_nn", 100, 200, 800)
    b.launch("nccl:all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
             150, 1000, 4000, stream=20)
    for i in range(3):  # three syncs: 900-5100 waits on the all-reduce; two short ones after it
        ext = b.cpu("aten::item", 900 if i == 0 else 5200 + 100 * i, 10)
        b.runtime("cudaStreamSynchronize", 900 if i == 0 else 5200 + 100 * i, 4200 if i == 0 else 50, ext)
    b.write(str(tmp_path / "r.json"))
    (sync,) = [c for c in analyze(load_set(str(tmp_path)))["checks"] if c["pattern"] == "too_many_syncs"]
    assert sync["nccl_wait_us"] == 4000 and sync["time_at_stake_us"] == 4200 + 2 * 50 - 4000


@settings(max_examples=200, deadline=None)
@given(st.sets(st.integers(0, 300), min_size=1, max_size=60))
def test_rank_ranges_round_trip(ranks):
    text = rank_ranges(list(ranks))
    back = set()
    for part in text.split(", "):
        lo, _, hi = part.partition("-")
        back.update(range(int(lo), int(hi or lo) + 1))
    assert back == ranks and len(text.split(", ")) <= len(ranks)


def test_render_without_findings_says_why():
    buf = io.StringIO()
    render_findings({"findings": [], "thresholds": {"min_time_share_pct": 1.0}}, Console(file=buf, width=160))
    assert "1% of the span" in buf.getvalue()


def test_diff_never_shows_negative_totals_from_rounding():
    a = load_set("tests/data/traces/cpu_gloo_clean")
    b = load_set("tests/data/traces/cpu_gloo_sync_straggler")
    doc = diff_sets(a, b)
    assert all(r["total_a_us"] >= 0 and r["total_b_us"] >= 0 for r in doc["rows"])
    assert any(n.startswith("A: ") and "shorter than 1 us" in n and "0 us here" in n for n in doc["notes"])


def test_a_cause_ranks_by_the_idle_it_explains(doc64):
    """cudaFree thrash costs 2.4% of the span itself but explains half of a 38% idle: it comes first."""
    roots = [f for f in doc64["findings"] if not f["caused_by"]]
    assert [f["pattern"] for f in roots] == ["alloc_thrash", "many_short_kernels"]
    assert roots[0]["impact_pct"] > 15 > roots[0]["share_of_span_pct"]["median"]
    buf = io.StringIO()
    render_findings(doc64, Console(file=buf, width=160))
    assert buf.getvalue().splitlines()[1].startswith("1. cudaMalloc/cudaFree thrash")


def test_checks_over_threshold_with_little_at_stake_are_mentioned(capsys):
    """64 .item() per step on CPU tensors: over the count threshold, ~0% of the span: named, not a finding."""
    assert main(["trace", "analyze", "tests/data/traces/cpu_gloo_sync_straggler"]) == 0
    out = capsys.readouterr().out
    assert "not reported" in out and "too_many_syncs (ranks 0-1" in out and "No anti-pattern found" in out
