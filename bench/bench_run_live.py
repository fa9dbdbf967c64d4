"""Benchmark what `otel-gpu run`'s live findings cost the job: its median step time with them on and off.

    python bench/bench_run_live.py [--runs 3] [--seconds 60] [--json OUT]

Each round runs a 2-rank gloo DDP job (tests/diagnose/jobs/onset_train.py --problem clean, started
with torchrun) under `otel-gpu run --record DIR --no-report`, once with the live findings (the
default: a child `diagnose --watch DIR --json -` at nice 10, one evaluation every 10 s over the last
2 minutes) and once with `--no-live`; the order alternates between rounds. Reported per run:

- the job's median step time: per rank, each export interval's mean step (the step-duration
  histogram's sum and count increase between consecutive points of the recording, 1 s apart), the
  first 10 s left out; the median over every interval of both ranks (ms); and steps per second;
- the live watcher's CPU seconds (utime + stime from /proc/<pid>/stat, read every 0.5 s while it
  lives: at most half a second of it is missed) and its lifetime;
- the watcher's status lines (watch.log) and, after the run, what one evaluation of the finished
  recording costs in this process (wall and CPU, median of 5);
- the CPU seconds of the whole run (`otel-gpu run`, the ranks, the node agent, the watcher), from
  this process's RUSAGE_CHILDREN, and the load average.

Runnable by hand only (pytest does not collect bench/).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otel_gpu import names as N  # noqa: E402
from otel_gpu.record.reader import Recording  # noqa: E402

JOB = ROOT / "tests" / "diagnose" / "jobs" / "onset_train.py"
WARMUP_S = 10.0


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of `pid` in seconds, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read(4096).rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def find_watcher(run_dir: Path) -> int | None:
    """The pid of the `diagnose --watch <run_dir>` process, None when there is none (yet)."""
    want = str(run_dir).encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read(65536).split(b"\0")
        except OSError:
            continue
        if b"--watch" in argv and want in argv:
            return int(entry)
    return None


class WatcherCpu(threading.Thread):
    """Follows the watcher child of one run: its last CPU reading and when it was first and last seen."""

    def __init__(self, run_dir: Path, done: threading.Event):
        super().__init__(daemon=True)
        self.run_dir, self.done = run_dir, done
        self.pid: int | None = None
        self.cpu_s: float | None = None
        self.first_seen: float | None = None
        self.last_seen: float | None = None

    def run(self) -> None:
        while not self.done.wait(0.5):
            if self.pid is None:
                self.pid = find_watcher(self.run_dir)
                if self.pid is None:
                    continue
                self.first_seen = time.time()
            cpu = proc_cpu_s(self.pid)
            if cpu is not None:
                self.cpu_s, self.last_seen = cpu, time.time()


def step_times(run_dir: Path) -> tuple[list[float], float]:
    """(each rank's per-interval mean step times in s after the warm-up, steps per second of rank 0)."""
    with Recording.open([run_dir]) as rec:
        hist = rec.series(N.TRAIN_STEP_DURATION.name)
        steps = rec.series(N.TRAIN_STEPS.name)
    means: list[float] = []
    for s in hist:
        t_first = s.points[0][0]
        rows = list(zip(s.points, s.counts))
        for ((t0, sum0), n0), ((t1, sum1), n1) in zip(rows, rows[1:]):
            if t1 - t_first >= WARMUP_S and n1 > n0:
                means.append((sum1 - sum0) / (n1 - n0))
    rate = 0.0
    for s in steps:
        if s.get(N.RANK) == "0" and len(s.points) > 1:
            pts = [p for p in s.points if p[0] - s.points[0][0] >= WARMUP_S]
            if len(pts) > 1:
                rate = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    return means, rate


def one_run(live: bool, seconds: float, work: Path, k: int) -> dict:
    run_dir = work / f"run-{k}-{'live' if live else 'nolive'}"
    truth = work / f"truth-{k}.jsonl"
    cmd = [sys.executable, "-m", "otel_gpu", "run", "--record", str(run_dir), "--no-report",
           *([] if live else ["--no-live"]), "--",
           "torchrun", "--nproc_per_node", "2", "--master_port", str(29500 + 10 * k), str(JOB),
           "--problem", "clean", "--seconds", str(seconds), "--truth", str(truth)]
    done = threading.Event()
    watcher = WatcherCpu(run_dir, done)
    watcher.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 300)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"run {k} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    means, rate = step_times(run_dir)
    log = run_dir / "watch.log"
    status = log.read_text(errors="replace").splitlines()[:20] if log.exists() else []
    live_lines = [line for line in proc.stderr.splitlines() if "appeared" in line or "changed" in line]
    return {
        "live": live, "wall_s": wall, "median_step_ms": statistics.median(means) * 1000 if means else None,
        "intervals": len(means), "steps_per_s": rate,
        "tree_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "watcher_pid": watcher.pid, "watcher_cpu_s": watcher.cpu_s,
        "watcher_lifetime_s": (watcher.last_seen - watcher.first_seen) if watcher.first_seen and watcher.last_seen else None,
        "live_finding_lines": live_lines, "watch_log": status, "loadavg": os.getloadavg()[0],
        "evaluation": evaluation_cost(run_dir) if live else None,
    }


def evaluation_cost(run_dir: Path, n: int = 5) -> dict:
    """Wall and CPU seconds (medians of `n`) of one watch evaluation over the finished recording, in this
    process: what each of the watcher's evaluations costs, its start-up aside."""
    from otel_gpu.diagnose.thresholds import Thresholds
    from otel_gpu.diagnose.watch import RecordingSource, Watcher
    from otel_gpu.diagnose.watch_state import Tracker

    w = Watcher(RecordingSource([run_dir], 120.0), Thresholds(), Tracker(), lambda e: None, lambda line: None)
    walls, cpus = [], []
    for _ in range(n):
        c0, w0 = time.process_time(), time.perf_counter()
        w.step(time.time())
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "state": w.state}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="runs each way")
    ap.add_argument("--seconds", type=float, default=60.0, help="length of each training job")
    ap.add_argument("--json", help="write the figures as JSON")
    a = ap.parse_args()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-run-live-") as tmp:
        for k in range(2 * a.runs):
            live = (k % 2 == 0) == (k // 2 % 2 == 0)   # live, off, off, live, live, off ...
            r = one_run(live, a.seconds, Path(tmp), k)
            rows.append(r)
            w = (f"watcher CPU {r['watcher_cpu_s']:.2f} s over {r['watcher_lifetime_s']:.0f} s" if live and
                 r["watcher_cpu_s"] is not None else ("watcher not seen" if live else "no watcher"))
            print(f"run {k + 1} live {'on ' if live else 'off'}: median step {r['median_step_ms']:.2f} ms "
                  f"({r['intervals']} intervals), {r['steps_per_s']:.1f} steps/s, whole run CPU {r['tree_cpu_s']:.1f} s, "
                  f"{w}; load {r['loadavg']:.2f}; {len(r['live_finding_lines'])} live finding line(s)")
            for line in r["live_finding_lines"]:
                print(f"    {line}")
            for line in r["watch_log"]:
                print(f"    watch.log: {line}")
            if r["evaluation"]:
                e = r["evaluation"]
                print(f"    one evaluation of this recording in-process: wall {e['wall_s'] * 1000:.0f} ms, "
                      f"CPU {e['cpu_s'] * 1000:.0f} ms (state {e['state']!r})")
    on = [r for r in rows if r["live"]]
    off = [r for r in rows if not r["live"]]
    med = lambda rs, k: statistics.median(r[k] for r in rs if r[k] is not None)   # noqa: E731
    f = {"runs_each": a.runs, "seconds": a.seconds, "loadavg_before": load, "loadavg_after": os.getloadavg(),
         "median_step_ms_live": med(on, "median_step_ms"), "median_step_ms_nolive": med(off, "median_step_ms"),
         "steps_per_s_live": med(on, "steps_per_s"), "steps_per_s_nolive": med(off, "steps_per_s"),
         "tree_cpu_s_live": med(on, "tree_cpu_s"), "tree_cpu_s_nolive": med(off, "tree_cpu_s"),
         "watcher_cpu_s": [r["watcher_cpu_s"] for r in on], "watcher_lifetime_s": [r["watcher_lifetime_s"] for r in on],
         "runs": rows}
    f["ratio_step"] = f["median_step_ms_live"] / f["median_step_ms_nolive"]
    spread = [r["median_step_ms"] for r in off]
    print(f"median step, live on {f['median_step_ms_live']:.2f} ms vs off {f['median_step_ms_nolive']:.2f} ms: ratio "
          f"{f['ratio_step']:.3f} (off runs alone span {min(spread):.2f}-{max(spread):.2f} ms); steps/s "
          f"{f['steps_per_s_live']:.1f} vs {f['steps_per_s_nolive']:.1f}")
    cpu = [c for c in f["watcher_cpu_s"] if c is not None]
    life = [x for x in f["watcher_lifetime_s"] if x]
    if cpu and life:
        print(f"live watcher CPU: {', '.join(f'{c:.2f}' for c in cpu)} s over {', '.join(f'{x:.0f}' for x in life)} s "
              f"({statistics.median(c / x for c, x in zip(cpu, life)) * 100:.1f}% of one CPU, median); whole run CPU "
              f"{f['tree_cpu_s_live']:.1f} s live vs {f['tree_cpu_s_nolive']:.1f} s off (medians)")
    print(f"load average after {f['loadavg_after'][0]:.2f}")
    if a.json:
        Path(a.json).write_text(json.dumps(f, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
