"""Benchmark one `otel-gpu diagnose --watch` evaluation against VictoriaMetrics, beside a one-shot `diagnose`.

    python bench/bench_watch.py [--nodes 8] [--gpus 8] [--minutes 10] [--interval 5] [--runs 6]
                                [--every 10] [--vm-cache] [--profile] [--json OUT]

A synthetic job (tests/diagnose/backfill.py: `nodes` x `gpus` ranks, a straggler with a throttled GPU,
checkpoints every 3 minutes) is written as Prometheus text with millisecond timestamps and imported into
a fresh VictoriaMetrics (`/api/v1/import/prometheus`, then a flush). Its series run from well before
the first window to a few minutes past the bench's own end, so every window ending now holds
`minutes` of data, as for a job that is running. Every `--every` seconds one run evaluates, at the same
`now`: `Watcher.step(now)` with a `PromSource` (fetch_window, the rules, the slowdown check, the
tracker; the source keeps its connection between evaluations, as `--watch` does) and an in-process
`diagnose()` of the window ending at `now` with a fresh client (what the one-shot command does); the
order alternates. Each is timed as wall (perf_counter) and CPU (process_time of this process, every
thread), plus the server's own CPU (utime + stime of the VictoriaMetrics process). The bar (issue 33):
the watch evaluation under 1 s wall and under 0.5 s CPU.

The timings mean something only when the evaluation read the job: the bench checks that every
imported series name is one the diagnosis queries select, that the window holds every rank, GPU and
node, and that the injected problems were found (checkpoint share, the straggler rank and node, the
throttled GPU, stalls every 3 minutes; the phase those are matched to is printed, not checked); it exits
1 otherwise or when over the bar. `--vm-cache` turns
VictoriaMetrics' response cache back on (the test server disables it). `--profile` adds a cProfile
of one more watch evaluation (top functions by own time) and the wall of each PromQL request.
Runnable by hand only (pytest does not collect bench/).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from otel_gpu.diagnose import diagnose, run_rules  # noqa: E402
from otel_gpu.diagnose import queries as Qb  # noqa: E402
from otel_gpu.diagnose.thresholds import Thresholds  # noqa: E402
from otel_gpu.diagnose.watch import PromSource, Watcher  # noqa: E402
from otel_gpu.diagnose.watch_state import Tracker  # noqa: E402
from otel_gpu.promql import PromClient  # noqa: E402
from tests.diagnose.backfill import SyntheticJob  # noqa: E402
from tests.servers import VictoriaMetrics  # noqa: E402

WALL_BAR_S, CPU_BAR_S = 1.0, 0.5
CHUNK_BYTES = 8 << 20   # one import request


class PromTextImporter:
    """SyntheticJob's writer interface (`family`, `series`) sending Prometheus text with millisecond
    timestamps to VictoriaMetrics' `/api/v1/import/prometheus`, in requests of about CHUNK_BYTES."""

    def __init__(self, url: str):
        self.url = f"{url}/api/v1/import/prometheus"
        self.http = httpx.Client(timeout=120)
        self.parts: list[str] = []
        self.size = 0
        self.samples = 0
        self.bytes = 0
        self.names: set[str] = set()

    def family(self, name: str, kind: str) -> None:   # Prometheus text needs no TYPE line for an import
        pass

    def series(self, sample: str, labels: dict[str, str], times, values) -> None:
        lbl = ",".join(f'{k}="{v}"' for k, v in labels.items())
        prefix = f"{sample}{{{lbl}}} "
        text = "".join(f"{prefix}{v:.9g} {round(t * 1000)}\n" for t, v in zip(times, values))
        self.parts.append(text)
        self.size += len(text)
        self.samples += len(times)
        self.names.add(sample)
        if self.size >= CHUNK_BYTES:
            self.send()

    def send(self) -> None:
        if not self.parts:
            return
        body = "".join(self.parts).encode()
        r = self.http.post(self.url, content=body)
        if r.status_code != 204:
            raise RuntimeError(f"import failed: HTTP {r.status_code}: {r.text[:300]}")
        self.bytes += len(body)
        self.parts, self.size = [], 0

    def close(self) -> None:
        self.send()
        self.http.close()


class SeenTracker(Tracker):
    """The tracker, keeping the findings it was handed last (to check what the evaluation found)."""

    last: list = []

    def update(self, t, findings):
        self.last = list(findings)
        return super().update(t, findings)


def server_cpu_s(pid: int) -> float:
    """utime + stime of process `pid` in seconds (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read(4096).rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn, pid: int):
    """(result, wall s, CPU s of this process, CPU s of the server)."""
    s0, c0, w0 = server_cpu_s(pid), time.process_time(), time.perf_counter()
    out = fn()
    w, c = time.perf_counter() - w0, time.process_time() - c0
    return out, w, c, server_cpu_s(pid) - s0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10.0, help="the watch window (--last)")
    ap.add_argument("--interval", type=float, default=5.0, help="export interval of the synthetic series (s)")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between runs (the watch's --every)")
    ap.add_argument("--vm-cache", action="store_true", help="VictoriaMetrics' response cache on")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", help="write the figures as JSON")
    a = ap.parse_args()

    last = a.minutes * 60
    bench_s = a.runs * a.every + 120   # the series reach past the bench's end
    now0 = time.time()
    end = math.floor((now0 + bench_s) / a.interval) * a.interval
    job = SyntheticJob(job="bench-watch", nodes=a.nodes, gpus_per_node=a.gpus, duration=end - (now0 - last - 120),
                       interval=a.interval, end=end, ckpt_every=180.0, ckpt_s=20.0,
                       straggler=a.nodes * a.gpus // 2 + 3)
    load = os.getloadavg()
    figures: dict = {"nodes": a.nodes, "gpus_per_node": a.gpus, "window_s": last, "interval_s": a.interval,
                     "runs": a.runs, "every_s": a.every, "vm_cache": a.vm_cache, "loadavg_before": load}
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")

    with tempfile.TemporaryDirectory(prefix="bench-watch-") as tmp:
        vm = VictoriaMetrics(tmp, extra_args=["-search.disableCache=false"] if a.vm_cache else [])
        vm.start()
        try:
            t0 = time.perf_counter()
            imp = PromTextImporter(vm.url)
            job.write(imp)
            imp.close()
            vm.flush()
            figures.update(samples=imp.samples, import_mb=imp.bytes / 1e6, load_s=time.perf_counter() - t0)
            print(f"imported {imp.samples / 1e6:.2f} M samples ({imp.bytes / 1e6:.0f} MB text, {len(imp.names)} names) "
                  f"into VictoriaMetrics in {figures['load_s']:.1f} s")
            figures["names"] = check_names(vm.url, imp.names)
            rc = bench(a, vm, job, last, figures)
        finally:
            vm.stop()
    if a.json:
        Path(a.json).write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return rc


def check_names(url: str, imported: set[str]) -> dict:
    """The names VictoriaMetrics holds, and whether the diagnosis queries select each of them."""
    got = httpx.get(f"{url}/api/v1/label/__name__/values", timeout=30).json()["data"]
    text = " ".join([Qb.rank_summary("", 600, 1), Qb.gpu_summary("", 600, 1), Qb.node_summary("", 600),
                     Qb.timeline("", "", 15), Qb.rank_busy("", 15)])
    unread = sorted(n for n in got if n not in text)
    missing = sorted(imported - set(got))
    print(f"VictoriaMetrics holds {len(got)} names; not selected by any diagnosis query: {unread or 'none'}; "
          f"imported but absent: {missing or 'none'}")
    return {"held": sorted(got), "unread": unread, "missing": missing}


def bench(a, vm: VictoriaMetrics, job: SyntheticJob, last: float, figures: dict) -> int:
    th = Thresholds()
    tracker = SeenTracker()
    events: list[dict] = []
    source = PromSource(vm.url, job.job, last, timeout=60)
    watcher = Watcher(source, th, tracker, events.append, lambda line: print(f"  watch: {line}"))
    rows = []
    try:
        for k in range(a.runs):
            if k:
                time.sleep(max(0.0, rows[-1]["now"] + a.every - time.time()))
            now = time.time()
            q0 = source.client.stats.queries

            def one_shot():
                with PromClient(vm.url, timeout=60) as client:
                    return diagnose(client, job.job, now - last, now, thresholds=th)

            order = ("watch", "diagnose") if k % 2 == 0 else ("diagnose", "watch")
            row = {"now": now, "order": order}
            for what in order:
                if what == "watch":
                    evs, *t = timed(lambda: watcher.step(now), vm.pid)
                    row.update(watch=t, events=[(e["event"], e["rule"]) for e in evs],
                               queries=source.client.stats.queries - q0)
                else:
                    report, *t = timed(one_shot, vm.pid)
                    row.update(diagnose=t, diagnose_queries=report.queries["queries"])
            rows.append(row)
            w, d = row["watch"], row["diagnose"]
            print(f"run {k + 1} ({order[0]} first): watch wall {w[0]:.3f} s CPU {w[1]:.3f} s (server {w[2]:.2f} s, "
                  f"{row['queries']} queries, {len(row['events'])} events) | one-shot wall {d[0]:.3f} s "
                  f"CPU {d[1]:.3f} s (server {d[2]:.2f} s, {row['diagnose_queries']} queries) | "
                  f"ratio wall {w[0] / d[0]:.2f} CPU {w[1] / d[1]:.2f}")
        checks = check(source, tracker, job, last, report)
        if a.profile:
            figures["profile"] = profile(watcher, source)
    finally:
        source.close()
    summarise(rows, figures, checks)
    figures["events"] = [(e["event"], e["rule"], e["severity"]) for e in events]
    for e in events:
        print(f"  event {e['event']} [{e['severity']}] {e['rule']}: {e['title']} (step {e.get('step')})")
    ok = all(checks.values()) and figures["watch_wall_median_s"] < WALL_BAR_S and figures["watch_cpu_median_s"] < CPU_BAR_S
    return 0 if ok else 1


def summarise(rows: list[dict], figures: dict, checks: dict) -> None:
    med = lambda key, i: statistics.median(r[key][i] for r in rows)   # noqa: E731
    figures.update(
        watch_wall_median_s=med("watch", 0), watch_cpu_median_s=med("watch", 1), watch_server_cpu_median_s=med("watch", 2),
        watch_wall_max_s=max(r["watch"][0] for r in rows), watch_cpu_max_s=max(r["watch"][1] for r in rows),
        diagnose_wall_median_s=med("diagnose", 0), diagnose_cpu_median_s=med("diagnose", 1),
        diagnose_server_cpu_median_s=med("diagnose", 2),
        ratio_wall=med("watch", 0) / med("diagnose", 0), ratio_cpu=med("watch", 1) / med("diagnose", 1),
        runs_detail=rows, checks=checks, loadavg_after=os.getloadavg())
    f = figures
    print(f"medians over {len(rows)} runs: watch wall {f['watch_wall_median_s']:.3f} s (max {f['watch_wall_max_s']:.3f}), "
          f"CPU {f['watch_cpu_median_s']:.3f} s (max {f['watch_cpu_max_s']:.3f}), server CPU "
          f"{f['watch_server_cpu_median_s']:.2f} s; one-shot wall {f['diagnose_wall_median_s']:.3f} s, CPU "
          f"{f['diagnose_cpu_median_s']:.3f} s, server CPU {f['diagnose_server_cpu_median_s']:.2f} s; "
          f"ratio watch/one-shot wall {f['ratio_wall']:.2f}, CPU {f['ratio_cpu']:.2f}")
    print(f"bar: wall < {WALL_BAR_S} s {'met' if f['watch_wall_median_s'] < WALL_BAR_S else 'NOT met'}, "
          f"CPU < {CPU_BAR_S} s {'met' if f['watch_cpu_median_s'] < CPU_BAR_S else 'NOT met'} (medians); "
          f"load average after {f['loadavg_after'][0]:.2f}")
    for name, ok in checks.items():
        print(f"  {'ok ' if ok else 'BAD'} {name}")


def check(source: PromSource, tracker: SeenTracker, job: SyntheticJob, last: float, report) -> dict[str, bool]:
    """What the last watch evaluation found (its window and the findings it handed the tracker)."""
    w = source.window(time.time())   # the window as the watch reads it (untimed)
    found = {}
    for f in tracker.last:
        found.setdefault(f["rule"], f)
    n = job.nodes * job.gpus_per_node
    slow = str(job.straggler)
    host = job.host(job.straggler // job.gpus_per_node)
    ts = [t for t in job.times() if w.start < t <= w.end]
    ckpt_share = sum(job.in_ckpt(t) for t in ts) / max(1, len(ts))
    ck, st, th = found.get("checkpoint"), found.get("straggler"), found.get("throttle")
    print("findings of the last watch evaluation:")
    for f in tracker.last:
        print(f"  [{f['severity']}] {f['rule']}: {f['title']}")
    if "periodic" in found:   # said, not checked: a drop cut by the window's start can match another phase
        print(f"  (periodic stalls matched to {found['periodic']['evidence'].get('matched_phase')}; the truth is checkpoint)")
    return {
        f"{n} ranks, {n} GPUs, {job.nodes} nodes in the watch window":
            (len(w.ranks), len(w.gpus), len(w.nodes)) == (n, n, job.nodes),
        "one-shot window the same size": (len(report.window.ranks), len(report.window.gpus)) == (n, n),
        f"checkpoint share {ckpt_share:.3f} within 1 point":
            ck is not None and abs(ck["evidence"]["share"] - ckpt_share) < 0.01,
        f"straggler rank {slow} on {host} named":
            st is not None and st["where"].get("ranks") == [slow] and st["where"].get("nodes") == [host],
        f"throttled GPU of rank {slow} named": th is not None and th["where"].get("ranks") == [slow],
        "stalls every 180 s found": "periodic" in found and abs(found["periodic"]["evidence"]["period_s"] - 180) < 18,
        "no stall, no slowdown on a steady job": not ({"stall", "slowdown"} & set(found)),
        "one-shot found the same rules": {f.rule for f in report.findings} == set(found) - {"slowdown"},
    }


def profile(watcher: Watcher, source: PromSource) -> dict:
    """cProfile of one more evaluation: top functions by own time, and each request's wall."""
    import cProfile
    import io
    import pstats

    from otel_gpu import promql

    walls: list[tuple[str, float]] = []
    original = promql.PromClient._call

    def traced(self, path, params, **kw):
        t0 = time.perf_counter()
        try:
            return original(self, path, params, **kw)
        finally:
            walls.append((f"{path} {str(params.get('query', ''))[:70]}", time.perf_counter() - t0))

    promql.PromClient._call = traced
    prof = cProfile.Profile()
    try:
        prof.enable()
        watcher.step(time.time())
        prof.disable()
    finally:
        promql.PromClient._call = original
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    print("profile of one watch evaluation (own time):")
    print(out.getvalue())
    for what, s in walls:
        print(f"  request {s:.3f} s  {what}")
    return {"requests": walls, "top": out.getvalue()}


if __name__ == "__main__":
    sys.exit(main())
