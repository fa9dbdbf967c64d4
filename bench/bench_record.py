"""Recording a run: its cost to the training process next to the OTLP path's, the store's write
cost and size, and report / diagnose times on a generated 1-hour, 8-rank, 8-GPU recording.

1. Training side, in interleaved rounds (none, otlp, record, none, otlp, record ...): the same CPU
   training loop as bench_training.py (its worker), exporting every second and profiling at 50 Hz,
   to a sink that answers 200 (`otlp`: stands in for a collector and Pyroscope) or to the recorder
   (`record`: loopback receivers writing SQLite, in this process as under `otel-gpu run`).
2. Store: write cost per point (decode included), bytes per point, and time to read the 20 series
   families a diagnosis reads, for SQLite (the chosen store), an append-only log of the raw OTLP
   bodies, and Parquet (when pyarrow is installed).
3. A generated recording of 1 hour: 8 ranks, 8 GPUs (the agent's real series set, from 8 fake
   GPUs), export every second, profiles every 2 s: `otel-gpu report` and `otel-gpu diagnose` wall
   time and the HTML size, against the bars (10 s, 2 s, 5 MB).

    python bench/bench_record.py [--rounds 3] [--steps 60] [--hours 1] [--skip-cost] [--skip-big]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from otel_gpu import names as N  # noqa: E402
from otel_gpu.record import decode  # noqa: E402
from otel_gpu.record.decode import Point, ProfileRows  # noqa: E402
from otel_gpu.record.receiver import Receiver  # noqa: E402
from otel_gpu.record.store import Writer  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_training", ROOT / "bench" / "bench_training.py")
bt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bt)


# ---- 1. training side ------------------------------------------------------------------------

def training_cost(rounds: int, steps: int, step_ms: float) -> None:
    width = bt.calibrate(step_ms)
    sink = bt.Sink()
    tmp = Path(tempfile.mkdtemp(prefix="bench-record-"))
    rx = Receiver(Writer(tmp / "rec", {"job": "bench"})).start()
    targets = {"none": (sink.url, {"OTELGPU_TRAINING": "0"}), "otlp": (sink.url, bt.CONFIGS["profile"]),
               "record": (rx.url, bt.CONFIGS["profile"])}
    per = {c: [] for c in targets}
    cpu = {c: [] for c in targets}
    for r in range(rounds):
        for name, (url, cfg) in targets.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL", "RANK", "WORLD_SIZE", "LOCAL_RANK"))}
            env.update({"PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_METRIC_EXPORT_INTERVAL": "1000",
                        "OTELGPU_PYROSCOPE_URL": url, "OTELGPU_PROFILE_UPLOAD_S": "2", "OTELGPU_JOB": "bench",
                        "OMP_NUM_THREADS": "1", **cfg})
            out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_training.py"), "--worker", "--steps", str(steps),
                                  "--width", str(width), "--warmup", "5"], env=env, capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            per[name].append(statistics.median(res["steps"]))
            cpu[name].append(res["cpu_per_step"])
        print(f"round {r + 1}/{rounds}: " + "  ".join(f"{c} {per[c][-1] * 1000:.2f} ms" for c in targets), flush=True)
    rx.stop()
    rx.writer.close()
    print(f"\n1. training side: MLP width {width}, one torch thread, {rounds} rounds x {steps} steps, metrics every 1 s, "
          f"wall-clock profiles 50 Hz pushed every 2 s; the recorder stored {rx.counts.points} points and "
          f"{rx.counts.samples} samples ({sink.requests} requests to the sink)")
    print(f"{'config':<8} {'step ms':>8} {'paired/none':>12} {'proc CPU ms':>12} {'record/otlp':>12}")
    for c in targets:
        paired = statistics.median(a / b for a, b in zip(per[c], per["none"]))
        vs = statistics.median(a / b for a, b in zip(per[c], per["otlp"]))
        print(f"{c:<8} {statistics.median(per[c]) * 1000:8.2f} {paired:12.4f} {statistics.median(cpu[c]) * 1000:12.2f} {vs:12.4f}")


# ---- generated data --------------------------------------------------------------------------

def agent_series(gpus: int = 8) -> list[tuple[str, str, str, dict]]:
    """(metric, kind, unit, attrs) of every series the real agent exports for `gpus` fake GPUs."""
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", f"--fake-gpus={gpus}", "--once", "--json"],
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, check=True)
    specs = {s.name: s for s in N.all_specs()}
    series = []
    for r in json.loads(out.stdout):
        spec = specs.get(r["name"])
        kind = {"counter": "counter", "updowncounter": "updowncounter"}.get(spec.kind if spec else "", "gauge")
        series.append((r["name"], kind, r["unit"], r["attributes"]))
        for comp in (N.windowed_companions(spec) if spec and spec.windowed else ()):
            series.append((comp.name, "gauge", comp.unit, r["attributes"]))
    return series


RES = (("host.name", "node1"), ("otelgpu.job", "big"), ("service.name", "otel-gpu"))
PHASES = ("data_wait", "forward", "backward", "optimizer", "checkpoint")
FUNCS = [f"mod{i}.fn{j}" for i in range(12) for j in range(8)]


def rank_points(t: float, i: int, rank: int, step_s: float) -> list[Point]:
    attrs = (("host.name", "node1"), ("otelgpu.job", "big"), ("otelgpu.local_rank", str(rank)),
             ("otelgpu.rank", str(rank)), ("otelgpu.world_size", "8"))
    n = i / step_s
    buckets = tuple([0] * 3 + [int(n)] + [0] * 13)
    pts = [Point(N.TRAIN_STEPS.name, "counter", "{step}", "cumulative", RES, attrs, t, n),
           Point(N.TRAIN_STEP_DURATION.name, "histogram", "s", "cumulative", RES, attrs, t, n * step_s, n, buckets,
                 N.STEP_BUCKETS),
           Point(N.TRAIN_SAMPLES.name, "counter", "{sample}", "cumulative", RES, attrs, t, n * 32)]
    shares = (0.05, 0.3, 0.45, 0.1, 0.02 if (i // 300) % 2 else 0.0)
    for p, share in zip(PHASES, shares):
        pts.append(Point(N.TRAIN_PHASE_TIME.name, "counter", "s", "cumulative", RES, attrs + ((N.PHASE, p),), t, i * share))
    return pts


def generate(directory: Path, hours: float, gpus: int = 8, ranks: int = 8) -> dict:
    """A recording of `hours` at 1 s exports; returns counts and write figures."""
    series = agent_series(gpus)
    w = Writer(directory, {"job": "big", "command": json.dumps(["python", "train.py"]), "host": "node1"})
    rng = random.Random(0)
    t0 = time.time() - hours * 3600 - 60
    seconds = int(hours * 3600)
    w.set_meta({"started": repr(t0), "ended": repr(t0 + seconds + 1), "exit_status": "0"})
    stacks = [tuple(["<module>", "main", "train"] + rng.sample(FUNCS, rng.randint(5, 25))) for _ in range(300)]
    points = samples = 0
    wall = time.perf_counter()
    for i in range(1, seconds + 1):
        t = t0 + i
        batch = []
        for name, kind, unit, attrs in series:
            v = i * 1e6 if kind == "counter" else (0.5 + 0.4 * rng.random() if unit == "1" else 100.0 + rng.random())
            batch.append(Point(name, kind, unit, "cumulative" if kind != "gauge" else "", RES,
                               tuple(sorted(attrs.items())), t, v))
        for rank in range(ranks):
            batch += rank_points(t, i, rank, 0.25 + 0.01 * rank)
        points += w.add_points(batch)
        if i % 2 == 0:
            profs = []
            for rank in range(ranks):
                labels = {"rank": str(rank), "job": "big", "node": "node1", "service_name": "otelgpu.big"}
                rows = [(s, (("phase", rng.choice(PHASES)),), 20_000_000) for s in rng.sample(stacks, 60)]
                profs.append(ProfileRows(labels, t - 2, t, "wall", "nanoseconds", 20_000_000, rows))
            samples += w.add_profiles(profs)
    wall = time.perf_counter() - wall
    w.close()
    return {"points": points, "samples": samples, "write_s": wall, "series": len(series) + ranks * 8}


# ---- 2. store alternatives ----------------------------------------------------------------------

def store_comparison(seconds: int = 300) -> None:
    """Write the agent's series set for `seconds` exports into each store; time, size, read-back."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest  # noqa: F401

    series = agent_series(8)
    rng = random.Random(1)

    def batch(i):
        out = []
        for name, kind, unit, attrs in series:
            v = i * 1e6 if kind == "counter" else rng.random()
            out.append(Point(name, kind, unit, "cumulative" if kind != "gauge" else "", RES, tuple(sorted(attrs.items())),
                             1.7e9 + i, v))
        return out

    bodies = [_encode(batch(i)) for i in range(1, seconds + 1)]
    npts = len(series) * seconds
    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    wanted = {N.GPU_UTILIZATION.name, N.GPU_SM_ACTIVITY.name, N.GPU_POWER.name, N.GPU_MEMORY_USAGE.name,
              N.CPU_UTILIZATION.name, N.NET_IO.name, N.DISK_IO.name, N.MEMORY_UTILIZATION.name}
    rows = []

    # SQLite: decode + one transaction per request (what the receiver does)
    w = Writer(tmp / "sqlite")
    t = time.perf_counter()
    for b in bodies:
        w.add_points(decode.otlp_points(b))
    write = time.perf_counter() - t
    w.close()
    from otel_gpu.record.reader import Recording
    t = time.perf_counter()
    with Recording.open([tmp / "sqlite"]) as rec:
        got = sum(len(s.points) for m in wanted for s in rec.series(m))
    read = time.perf_counter() - t
    rows.append(("sqlite", write, (tmp / "sqlite" / "recording.sqlite").stat().st_size, read, got))

    # raw log: length-prefixed bodies appended and fsync'd per request; reading decodes everything
    path = tmp / "otlp.log"
    t = time.perf_counter()
    with open(path, "wb") as fh:
        for b in bodies:
            fh.write(len(b).to_bytes(4, "little") + b)
            fh.flush()
            os.fsync(fh.fileno())
    write = time.perf_counter() - t
    t = time.perf_counter()
    got, data, i = 0, path.read_bytes(), 0
    while i < len(data):
        n = int.from_bytes(data[i:i + 4], "little")
        got += sum(1 for p in decode.otlp_points(data[i + 4:i + 4 + n]) if p.metric in wanted)
        i += 4 + n
    read = time.perf_counter() - t
    rows.append(("raw OTLP log", write, path.stat().st_size, read, got))

    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        pa = None
    if pa is not None:   # one row group per request, as a crash-safe writer must flush
        path = tmp / "points.parquet"
        schema = pa.schema([("metric", pa.string()), ("attrs", pa.string()), ("t", pa.float64()), ("value", pa.float64())])
        t = time.perf_counter()
        with pq.ParquetWriter(path, schema) as pw:
            for b in bodies:
                pts = decode.otlp_points(b)
                pw.write_table(pa.table({"metric": [p.metric for p in pts], "attrs": [json.dumps(p.attrs) for p in pts],
                                         "t": [p.t for p in pts], "value": [p.value for p in pts]}, schema=schema))
        write = time.perf_counter() - t
        t = time.perf_counter()
        tab = pq.read_table(path, filters=[("metric", "in", sorted(wanted))])
        got = tab.num_rows
        read = time.perf_counter() - t
        rows.append((f"parquet (pyarrow {pa.__version__})", write, path.stat().st_size, read, got))
    print(f"\n2. store: the agent's {len(series)} series (8 fake GPUs) for {seconds} exports = {npts} points")
    print(f"{'store':<26} {'write us/pt':>12} {'bytes/pt':>9} {'MB/hour':>8} {'read 8 families s':>18} {'points read':>12}")
    for name, write, size, read, got in rows:
        print(f"{name:<26} {write / npts * 1e6:12.2f} {size / npts:9.1f} {size / npts * len(series) * 3600 / 1e6:8.1f} "
              f"{read:18.3f} {got:12d}")


def _encode(points: list[Point]) -> bytes:
    """Points -> an OTLP request body (gauges and sums only), as an exporter would send them."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in RES)
    sm = rm.scope_metrics.add()
    for p in points:
        m = sm.metrics.add(name=p.metric, unit=p.unit)
        if p.kind == "gauge":
            dp = m.gauge.data_points.add()
        else:
            m.sum.is_monotonic = p.kind == "counter"
            m.sum.aggregation_temporality = AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
            dp = m.sum.data_points.add()
        dp.time_unix_nano = int(p.t * 1e9)
        dp.as_double = p.value
        dp.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in p.attrs)
    return req.SerializeToString()


# ---- 3. the big recording -------------------------------------------------------------------------

def big(hours: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-big-"))
    d = tmp / "big"
    g = generate(d, hours)
    db = (d / "recording.sqlite").stat().st_size
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def timed(args):
        """Best of 3 (wall s, CPU s of the child, stdout): the machine's other load only adds."""
        best = None
        for _ in range(3):
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "otel_gpu", *args], env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            if p.returncode != 0:
                raise SystemExit(f"otel-gpu {' '.join(args)} failed: {p.stderr}")
            cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
            if best is None or wall < best[0]:
                best = (wall, cpu, p.stdout)
        return best

    rep_s, rep_cpu, _ = timed(["report", str(d), "-o", str(tmp / "report.html")])
    diag_s, diag_cpu, out = timed(["diagnose", str(d)])
    html = (tmp / "report.html").stat().st_size
    print(f"\n3. generated recording: {hours:g} h, 8 ranks, 8 GPUs, {g['series']} series, {g['points']} points, "
          f"{g['samples']} profile samples; written in {g['write_s']:.1f} s ({g['write_s'] / g['points'] * 1e6:.1f} us/point)")
    print(f"   size on disk: {db / 1e6:.1f} MB ({db / hours / 1e6:.1f} MB per hour)")
    print(f"{'':<26} {'ours':>10} {'bar':>10} {'ratio':>8}   (best of 3; CPU = the command's user + system time)")
    for name, ours, bar, unit in (("otel-gpu report (wall)", rep_s, 10.0, "s"), ("otel-gpu report (CPU)", rep_cpu, 10.0, "s"),
                                  ("otel-gpu diagnose (wall)", diag_s, 2.0, "s"), ("otel-gpu diagnose (CPU)", diag_cpu, 2.0, "s"),
                                  ("report.html size", html / 1e6, 5.0, "MB")):
        print(f"{name:<26} {ours:9.2f}{unit[0]} {bar:9.1f}{unit[0]} {ours / bar:8.2f}")
    print("   diagnose said: " + out.strip().splitlines()[0][:160] if out.strip() else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--store-seconds", type=int, default=300)
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--skip-big", action="store_true")
    args = ap.parse_args()
    if not args.skip_cost:
        training_cost(args.rounds, args.steps, args.step_ms)
    store_comparison(args.store_seconds)
    if not args.skip_big:
        big(args.hours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
