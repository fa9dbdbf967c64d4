"""Benchmark `otel-gpu diagnose` on a large window: a 16-node x 8-GPU job over 6 hours at 5 s resolution.

    python bench/bench_diagnose.py [--nodes 16] [--gpus 8] [--hours 6] [--interval 5] [--runs 3]
                                   [--keep DIR] [--json OUT]

The job's series (what the rules query: GPU utilization, SM activity, power, temperature, SM clock,
two clock-event reasons, memory; per-rank steps, step time, five phases; per-node CPU, disk writes,
InfiniBand bytes and errors) are generated as OpenMetrics, backfilled into a fresh Prometheus with
promtool (timed apart), then diagnosed in-process `--runs` times and once through the CLI. Reported:
wall time, the number of PromQL queries and their server time, and whether the injected problems
(checkpoint share, the straggler rank and node, the throttled GPU) were found. `--keep DIR` reuses
a data directory from an earlier run (generation and backfill skipped).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otel_gpu.diagnose import diagnose  # noqa: E402
from otel_gpu.promql import PromClient  # noqa: E402
from tests.diagnose.backfill import OpenMetricsWriter, SyntheticJob, backfill  # noqa: E402
from tests.servers import Prometheus  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="data directory to create or reuse")
    ap.add_argument("--json", help="write the figures as JSON")
    a = ap.parse_args()

    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="bench-diagnose-"))
    work.mkdir(parents=True, exist_ok=True)
    meta_path = work / "job.json"
    figures: dict = {"nodes": a.nodes, "gpus_per_node": a.gpus, "hours": a.hours, "interval_s": a.interval}
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        job = SyntheticJob(**meta)
        print(f"reusing {work} (job ending {time.strftime('%H:%M', time.gmtime(job.end))} UTC)")
    else:
        end = math.floor(time.time() / 60) * 60 - int(2.5 * 3600)
        meta = dict(job="bench", nodes=a.nodes, gpus_per_node=a.gpus, duration=a.hours * 3600, interval=a.interval,
                    end=end, ckpt_every=1800.0, ckpt_s=120.0, straggler=a.nodes * a.gpus // 2 + 3)
        job = SyntheticJob(**meta)
        om = work / "job.om"
        t0 = time.perf_counter()
        with OpenMetricsWriter(om) as w:
            job.write(w)
        figures["generate_s"] = time.perf_counter() - t0
        figures["samples"] = w.samples
        figures["openmetrics_mb"] = om.stat().st_size / 1e6
        print(f"generated {w.samples / 1e6:.1f} M samples ({figures['openmetrics_mb']:.0f} MB OpenMetrics) "
              f"in {figures['generate_s']:.1f} s")
        figures["backfill_s"] = backfill(om, work / "data")
        print(f"backfilled with promtool in {figures['backfill_s']:.1f} s")
        om.unlink()
        meta_path.write_text(json.dumps(meta))

    prom = Prometheus("global:\n  scrape_interval: 15s\n", work, extra_args=["--query.max-samples=200000000"])
    t0 = time.perf_counter()
    prom.start()
    figures["prometheus_start_s"] = time.perf_counter() - t0
    try:
        runs = []
        for _ in range(a.runs):
            with PromClient(prom.url, timeout=60) as client:
                t0 = time.perf_counter()
                report = diagnose(client, job.job, job.start, job.end)
                runs.append((time.perf_counter() - t0, report))
        wall = [r[0] for r in runs]
        report = runs[-1][1]
        q = report.queries
        figures.update(diagnose_s_min=min(wall), diagnose_s_median=statistics.median(wall),
                       queries=q["queries"], by_endpoint=q["by_endpoint"], query_seconds=q["query_seconds"])
        print(f"diagnose, in-process, {a.runs} runs: min {min(wall):.2f} s, median {statistics.median(wall):.2f} s; "
              f"{q['queries']} PromQL queries ({q['by_endpoint']}) taking {q['query_seconds']:.2f} s on the server side")
        t0 = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "otel_gpu", "diagnose", "--prometheus", prom.url, "--job", job.job,
                              "--from", str(job.start), "--to", str(job.end), "--json", os.devnull],
                             capture_output=True, text=True, cwd=ROOT, timeout=300)
        figures["cli_s"] = time.perf_counter() - t0
        if cli.returncode != 0:
            print(cli.stderr, file=sys.stderr)
            return 1
        print(f"diagnose, CLI end to end (process start, imports, queries, rules, JSON): {figures['cli_s']:.2f} s")
        figures["checks"] = check(report, job)
        for name, ok in figures["checks"].items():
            print(f"  {'ok ' if ok else 'BAD'} {name}")
        print("findings:")
        for f in report.findings:
            print(f"  [{f.severity}] {f.title}")
    finally:
        prom.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return 0 if all(figures["checks"].values()) and figures["diagnose_s_median"] < 10 else 1


def check(report, job: SyntheticJob) -> dict[str, bool]:
    truth = job.truth()
    rules = {}
    for f in report.findings:
        rules.setdefault(f.rule, f)
    w = report.window
    ck, st, th = rules.get("checkpoint"), rules.get("straggler"), rules.get("throttle")
    return {
        f"all {job.nodes * job.gpus_per_node} GPUs and ranks read": len(w.gpus) == len(w.ranks) == job.nodes * job.gpus_per_node,
        f"checkpoint share {truth['checkpoint_share']:.4f} within 0.5 points":
            ck is not None and abs(ck.evidence["share"] - truth["checkpoint_share"]) < 0.005,
        f"straggler rank {truth['straggler']} on {truth['straggler_host']} named":
            st is not None and st.where == {"ranks": [str(truth["straggler"])], "nodes": [truth["straggler_host"]]},
        "throttled GPU named": th is not None and th.where.get("ranks") == [str(truth["straggler"])],
        "SMs idle behind utilization": "sm_idle" in rules and not rules["sm_idle"].missing,
        f"stalls every {truth['period_s']:.0f} s matched to checkpoints":
            "periodic" in rules and rules["periodic"].evidence["matched_phase"] == "checkpoint",
    }


if __name__ == "__main__":
    sys.exit(main())
