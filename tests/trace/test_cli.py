"""`otel-gpu trace analyze|diff` end to end: tables, JSON, CSV, errors without partial output."""
import csv
import gzip
import json
import os
import shutil

import pytest

from otel_gpu.cli import main
from kineto import training_trace

REAL = "tests/data/traces"


def test_analyze_writes_json_and_csv(tmp_path, capsys):
    out, cdir = tmp_path / "r.json", tmp_path / "csv"
    assert main(["trace", "analyze", f"{REAL}/cpu_gloo_sync_straggler", "--json", str(out), "--csv", str(cdir),
                 "--min-impact", "0"]) == 0
    doc = json.loads(out.read_text())
    assert doc["ranks"] == [0, 1] and doc["cross_rank"]["straggler"]["rank"] == 1
    assert "_launch_pairs" not in doc
    files = sorted(os.listdir(cdir))
    assert "findings.csv" in files and "steps.csv" in files and "cuda_kernel_launch_stats_rank1.csv" in files
    rows = list(csv.DictReader(open(cdir / "findings.csv")))
    assert {r["pattern"] for r in rows} == {"too_many_syncs"}
    text = capsys.readouterr().out
    assert "Straggler: rank 1" in text and "Too many GPU-to-CPU synchronizations" in text
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".otel-gpu")]


def test_analyze_gpu_tables(tmp_path, capsys):
    d = tmp_path / "run"
    d.mkdir()
    training_trace(0, pageable=True).write(str(d / "r0.json.gz"))
    training_trace(1, compute_scale=1.2).write(str(d / "r1.json"))
    assert main(["trace", "analyze", str(d), "--ranks", "0-1", "--csv", str(tmp_path / "c")]) == 0
    text = capsys.readouterr().out
    for title in ("Temporal breakdown", "GPU time by kernel type", "GPU idle time by stream",
                  "Communication / computation overlap", "Kernel launches", "Pageable host-to-device copies"):
        assert title in text
    launches = list(csv.DictReader(open(tmp_path / "c" / "cuda_kernel_launch_stats_rank0.csv")))
    assert len(launches) == 3 * 26  # 24 compute kernels, 1 NCCL kernel, 1 copy in each analysed step
    assert float(launches[0]["cpu_duration"]) == 5.0


def test_truncated_file_exit_2_and_no_outputs(tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(f"{REAL}/cpu_gloo_clean", d)
    data = gzip.open(d / "rank1.pt.trace.json.gz").read()
    with gzip.open(d / "rank1.pt.trace.json.gz", "wb") as fh:
        fh.write(data[: len(data) // 2])
    out, cdir = tmp_path / "r.json", tmp_path / "csv"
    assert main(["trace", "analyze", str(d), "--json", str(out), "--csv", str(cdir)]) == 2
    err = capsys.readouterr().err
    assert "rank1.pt.trace.json.gz" in err and "truncated" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not cdir.exists()
    assert sorted(os.listdir(tmp_path)) == ["run"]


def test_bad_inputs_exit_2(tmp_path, capsys):
    assert main(["trace", "analyze", str(tmp_path / "missing")]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main(["trace", "analyze", str(tmp_path)]) == 2
    assert "no .json" in capsys.readouterr().err
    assert main(["trace", "analyze", f"{REAL}/cpu_gloo_clean", "--ranks", "5"]) == 2
    assert "no trace for rank 5; found ranks 0, 1" in capsys.readouterr().err
    assert main(["trace", "analyze", f"{REAL}/cpu_gloo_clean", "--ranks", "0,5-6"]) == 2
    assert "no trace for ranks 5, 6; found ranks 0, 1" in capsys.readouterr().err
    assert main(["trace", "analyze", f"{REAL}/cpu_gloo_clean", "--ranks", "0-20"]) == 2
    assert "no trace for ranks 2, 3, 4, 5, 6, 7, 8, 9, ... (19 ranks);" in capsys.readouterr().err


def test_diff_sorted_by_impact(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    training_trace(0).write(str(a / "r0.json"))
    training_trace(0, short_kernels=True, compute_scale=1.5).write(str(b / "r0.json"))
    out = tmp_path / "d.json"
    assert main(["trace", "diff", str(a), str(b), "--json", str(out), "--csv", str(tmp_path / "c")]) == 0
    rows = json.loads(out.read_text())["rows"]
    impacts = [abs(r["delta_total_us"]) for r in rows]
    assert impacts == sorted(impacts, reverse=True)
    top = rows[0]
    assert top["name"] == "ampere_sgemm_128x64_nn" and top["kind"] == "kernel"
    assert top["delta_total_us"] == 3 * 24 * 200 and top["mean_b_us"] == 600
    added = [r for r in rows if r["status"] == "added"]
    assert {r["name"] for r in added} >= {"aten::add_", "void at::native::vectorized_elementwise_kernel<4>(int, float*)"}
    assert "Biggest changes" in capsys.readouterr().out
    assert (tmp_path / "c" / "trace_diff.csv").exists()


def test_parallel_reading_gives_the_same_result():
    from otel_gpu.trace.analyze import analyze, jsonable
    from otel_gpu.trace.model import load_set

    one = jsonable(analyze(load_set(f"{REAL}/cpu_gloo_sync_straggler", jobs=1)))
    two = jsonable(analyze(load_set(f"{REAL}/cpu_gloo_sync_straggler", jobs=2)))
    assert one == two and one["cross_rank"]["steps"]


def test_module_entry_point(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "otel_gpu.trace", "analyze", f"{REAL}/cpu_gloo_clean", "--quiet",
                        "--json", str(tmp_path / "o.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o.json").read_text())["findings"] == []
    r = subprocess.run([sys.executable, "-m", "otel_gpu.trace", "analyze", str(tmp_path / "none")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a folder" in r.stderr


def test_include_last_step_keeps_its_kernels(tmp_path):
    training_trace(0).write(str(tmp_path / "r0.json"))
    default, keep = tmp_path / "d", tmp_path / "k"
    assert main(["trace", "analyze", str(tmp_path), "--quiet", "--csv", str(default)]) == 0
    assert main(["trace", "analyze", str(tmp_path), "--quiet", "--csv", str(keep), "--include-last-step"]) == 0
    rows = lambda d: list(csv.DictReader(open(d / "cuda_kernel_launch_stats_rank0.csv")))  # noqa: E731
    assert len(rows(default)) == 3 * 26 and len(rows(keep)) == 4 * 26
    doc = json.loads(json.dumps([r for r in csv.DictReader(open(keep / "steps.csv"))]))
    assert [int(r["step"]) for r in doc] == [1, 2, 3, 4]


def test_analysis_knobs(tmp_path, capsys):
    out = tmp_path / "k.json"
    assert main(["trace", "analyze", "tests/data/traces/cpu_gloo_clean", "--quiet", "--json", str(out),
                 "--num-kernels", "3", "--kernel-delay", "10", "--runtime-cutoff", "20"]) == 0
    th = json.loads(out.read_text())["thresholds"]
    assert th["runtime_cutoff_us"] == 20
    # argparse refuses the value: one error line, exit 2
    assert main(["trace", "analyze", "tests/data/traces/cpu_gloo_clean", "--duration-ratio", "0"]) == 2
    assert "--duration-ratio" in capsys.readouterr().err
