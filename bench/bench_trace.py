"""Benchmark `otel-gpu trace analyze` against HolisticTraceAnalysis 0.5.0, side by side, same traces.

    python bench/bench_trace.py [--ranks 64] [--big 32] [--repeat 3] [--hta-analyses five|more|all] [--shared]

Per set, alternating, ``--repeat`` times each (medians shown, with the spread):
- HTA: ``TraceAnalysis(trace_dir=DIR)`` then, by default, its five original analyses (temporal,
  GPU kernel, idle time for all ranks with interval stats, comm/comp overlap, launch statistics
  for all ranks), each writing its tables as CSV;
- ours with the same analyses: ``python -m otel_gpu.trace analyze DIR --csv OUT --quiet
  --no-critical-path`` (which computes and writes more besides: queue length, memory bandwidth,
  stragglers, ATen ops, annotations, time series, findings);
- ours as run by default (every analysis, every rank's critical path included).
The table shows HTA's time over each of ours ("same x", "dflt x"), ours' default over ours' same
("dflt/same") and peak memory ratios. Each run is a fresh process; wall time is end to end, peak
RSS is the command's ru_maxrss as GNU time reports it (the largest of the process and its reaped
workers; both tools use fork-pool workers). Each tool runs from a venv of its own (made when
missing): HTA installed there (pip byte-compiles it); ours off this checkout, the versions of what
it imports installed here put there, byte-compiled with compileall before timing. After timing,
HTA's tables are compared with ours (percentages within 0.01 points, times within 1 us, same
kernels and counts). Sets: the largest multi-rank set replicated to ``--ranks`` ranks; one
generated set per ``--shapes`` entry (``bench/trace_shapes.py``: LLM, DLRM-style, CNN, NCCL-heavy;
``--shape-ranks`` ranks, deterministic from ``--seed``); and a large one (``--big``): ``--big-from``'s
events repeated ``--big-grow`` times per file, replicated to 32 ranks (about 3.9 M events). The bar
for each set: HTA's wall time at least 10x ours ("same x") and ours' peak memory at most 0.25x HTA's
("mem same").
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from otel_gpu.trace.critical_path import BOUNDS as CP_BOUNDS  # noqa: E402
from bench.trace_shapes import SHAPES, write_set  # noqa: E402
STDLIB_JSON = False
TIME = "/usr/bin/time" if os.path.exists("/usr/bin/time") else shutil.which("time")
HTA_SCRIPT = r"""
import sys, os, json
from hta.trace_analysis import TraceAnalysis
d, out, wanted = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
a = TraceAnalysis(trace_dir=d)
ranks = sorted(a.t.traces)
def save(df, name):
    if df is not None: df.to_csv(os.path.join(out, name))
def save_flat(df, name):  # describe() tables: flat headers
    if df is not None:
        df = df.copy(); df.columns = [c[1] if isinstance(c, tuple) else c for c in df.columns]
        df.reset_index().to_csv(os.path.join(out, name), index=False)
def critical_paths():  # ours' default window: the 2nd ProfilerStep when there are two, else the 1st
    sym = a.t.symbol_table.get_sym_id_map()
    ids = [v for k, v in sym.items() if "ProfilerStep" in k]
    got = {}
    for r in ranks:
        n = int(a.t.get_trace(r).name.isin(ids).sum()) if ids else 0
        ann, inst = ("ProfilerStep", 1 if n >= 2 else 0) if n else ("", None)
        try:
            g, ok = a.critical_path_analysis(rank=r, annotation=ann, instance_id=inst)
            e = g.get_critical_path_breakdown()
            pct = e.groupby("bound_by").duration.sum() / e.duration.sum() * 100
            got[r] = {"length_us": float(e.duration.sum()), "pct": {k: float(x) for k, x in pct.items() if k}}
        except Exception as exc:
            got[r] = {"error": repr(exc)[:300]}
    with open(os.path.join(out, "critical_path.json"), "w") as fh:
        json.dump(got, fh)
def stragglers():
    got = [int(r) for r in a.get_potential_stragglers()]
    with open(os.path.join(out, "potential_stragglers.json"), "w") as fh:
        json.dump(got, fh)
for step, call in [
    ("temporal", lambda: save(a.get_temporal_breakdown(visualize=False), "temporal_breakdown.csv")),
    ("kernels", lambda: [save(x, n) for x, n in zip(a.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True),
                        ["gpu_kernel_breakdown_kernel_type.csv", "gpu_kernel_breakdown_kernels.csv"])]),
    ("idle", lambda: [save(x, n) for x, n in zip(a.get_idle_time_breakdown(ranks=ranks, visualize=False, show_idle_interval_stats=True),
                     ["idle_time_breakdown.csv", "idle_time_interval_stats.csv"])]),
    ("overlap", lambda: save(a.get_comm_comp_overlap(visualize=False), "comm_comp_overlap.csv")),
    ("launch", lambda: [save(df, f"cuda_kernel_launch_stats_rank{r}.csv") for r, df in
                        a.get_cuda_kernel_launch_stats(ranks=ranks, visualize=False).items()]),
    ("queue", lambda: save_flat(a.get_queue_length_summary(ranks=ranks), "queue_length_summary.csv")),
    ("membw", lambda: save_flat(a.get_memory_bw_summary(ranks=ranks), "memory_bw_summary.csv")),
    ("stragglers", stragglers),
    ("critical_path", critical_paths),
]:
    if step not in wanted:
        continue
    try:
        call()
    except Exception as exc:
        print(f"HTA {step} failed: {exc!r}", file=sys.stderr)
"""


def ensure_hta(venv: str) -> str:
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py) or subprocess.run([py, "-c", "import hta"], capture_output=True).returncode:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        # HTA 0.5.0's critical path fails with pandas 3; numpy as ours (tie order of its sorts)
        import numpy
        subprocess.run([py, "-m", "pip", "install", "-q", "HolisticTraceAnalysis==0.5.0", "pandas==2.2.3",
                        f"numpy=={numpy.__version__}"], check=True)
    return py


def ensure_ours(venv: str) -> str:
    """A venv holding what ``python -m otel_gpu.trace`` imports (the versions installed here), from
    which ours runs off this checkout (PYTHONPATH), as HTA runs from its own venv: neither tool then
    pays for hooks the machine's Python may load at every start (site's .pth files)."""
    py = os.path.join(venv, "bin", "python")
    ready = os.path.exists(py) and not subprocess.run([py, "-c", "import numpy, msgspec, orjson, isal, rich"],
                                                      capture_output=True).returncode
    if not ready:
        from importlib.metadata import version
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q"] + [f"{m}=={version(m)}" for m in
                        ("numpy", "msgspec", "orjson", "isal", "rich")], check=True)
    return py


def measure(cmd: list[str], env: dict | None = None, cwd: str | None = None) -> tuple[float, float, int]:
    """(wall s, peak RSS MB, exit code) of one command, run under GNU time.

    GNU time (a tiny process) runs the command and reports its ru_maxrss, the largest of the
    command and its reaped worker processes. Measuring straight from this Python process would
    not do: a child's ru_maxrss starts from the RSS of the process it was forked from.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        t0 = time.perf_counter()
        p = subprocess.run([TIME, "-f", "%M", "-o", out.name, *cmd], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=env, cwd=cwd)
        wall = time.perf_counter() - t0
        if p.returncode:
            sys.stderr.write(p.stderr.decode()[-2000:])
        lines = [x for x in out.read().split() if x.isdigit()]
    return wall, (int(lines[-1]) / 1024 if lines else math.nan), p.returncode


def replicate(src: str, n: int, out: str) -> str:
    """A set of ``n`` ranks made of the ranks of ``src`` in turn, rank relabelled in distributedInfo."""
    files = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith((".json", ".gz")))
    docs = []
    for f in files:
        with (gzip.open(f, "rt") if f.endswith(".gz") else open(f)) as fh:
            docs.append(json.load(fh))
    os.makedirs(out, exist_ok=True)
    for r in range(n):
        doc = docs[r % len(docs)]
        doc.setdefault("distributedInfo", {})["rank"] = r
        with gzip.open(os.path.join(out, f"rank{r}.json.gz"), "wt", compresslevel=1) as fh:
            json.dump(doc, fh)
    return out


def grow(src_dir: str, n: int, out: str) -> str:
    """A single-rank set whose file repeats the events of ``src_dir``'s first file ``n`` times,
    shifted in time (correlation ids and step numbers kept distinct), written event by event."""
    f = sorted(os.path.join(src_dir, x) for x in os.listdir(src_dir) if x.endswith((".json", ".gz")))[0]
    with (gzip.open(f, "rt") if f.endswith(".gz") else open(f)) as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 10_000
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "rank0.json"), "w") as fh:
        fh.write(json.dumps(doc)[:-1] + ', "traceEvents": [\n')
        sep = ""
        for k in range(n):
            for e in events:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + k * span
                args = e2.get("args")
                if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                    e2["args"] = dict(args, correlation=args["correlation"] + k * 100_000_000)
                name = e2.get("name")
                if isinstance(name, str) and name.startswith("ProfilerStep#"):
                    e2["name"] = f"ProfilerStep#{int(name[13:]) + 1000 * k}"
                fh.write(sep + json.dumps(e2))
                sep = ",\n"
        fh.write("\n]}\n")
    return out


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _rows(path: str) -> list[dict] | None:
    return list(csv.DictReader(open(path))) if os.path.exists(path) else None


def compare(hta_dir: str, ours_dir: str) -> list[str]:
    """Differences between HTA's CSVs and ours (empty list: identical within tolerance)."""
    bad: list[str] = []

    def close(a, b, tol):
        a, b = _num(a), _num(b)
        return (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tol

    def check(name, key_cols, pairs):
        h, o = _rows(os.path.join(hta_dir, name)), _rows(os.path.join(ours_dir, name)) or []
        if h is None:
            return
        if len(h) != len(o):
            bad.append(f"{name}: {len(h)} rows vs {len(o)}")
            return
        for a, b in zip(h, o):
            if [a[k] for k, _ in key_cols] != [b[k2] for _, k2 in key_cols]:
                bad.append(f"{name}: row key {[a[k] for k, _ in key_cols]} vs {[b[k2] for _, k2 in key_cols]}")
                return
            for hk, ok, tol in pairs:
                if not close(a[hk], b[ok], tol):
                    bad.append(f"{name}: {hk} {a[hk]} vs {b[ok]}")
                    return
    check("temporal_breakdown.csv", [("rank", "rank")],
          [(f"{c}(us)", f"{c}_us", 1) for c in ("idle_time", "compute_time", "non_compute_time", "kernel_time")]
          + [(c, c, 0.01) for c in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg")])
    check("gpu_kernel_breakdown_kernel_type.csv", [("kernel_type", "kernel_type")],
          [("sum", "sum", 1), ("percentage", "percentage", 0.01)])
    check("gpu_kernel_breakdown_kernels.csv", [("kernel_type", "kernel_type"), ("name", "name"), ("rank", "rank")],
          [("sum (us)", "sum", 1), ("max (us)", "max", 1), ("min (us)", "min", 1), ("mean (us)", "mean", 1)])
    check("idle_time_breakdown.csv", [("rank", "rank"), ("stream", "stream"), ("idle_category", "idle_category")],
          [("idle_time", "idle_time", 1), ("idle_time_ratio", "idle_time_ratio", 0.01)])
    check("idle_time_interval_stats.csv", [("idle_category", "idle_category"), ("rank", "rank"), ("stream", "stream")],
          [(c, c, 0.01) for c in ("count", "mean", "std", "min", "25%", "50%", "75%", "max")])
    check("comm_comp_overlap.csv", [("rank", "rank")], [("comp_comm_overlap_pctg", "comp_comm_overlap_pctg", 0.01)])
    stats = [(c, c, 1e-6) for c in ("count", "mean", "std", "min", "25%", "50%", "75%", "max")]
    check("queue_length_summary.csv", [("rank", "rank"), ("stream", "stream")], stats)
    check("memory_bw_summary.csv", [("rank", "rank"), ("name", "name")], stats)
    hs = os.path.join(hta_dir, "potential_stragglers.json")
    if os.path.exists(hs):
        want = json.load(open(hs))
        got = [int(r["rank"]) for r in _rows(os.path.join(ours_dir, "potential_stragglers.csv")) or []
               if r["potential_straggler"] == "True"]
        if sorted(want) != sorted(got):
            bad.append(f"potential stragglers: {want} vs {got}")
    hc = os.path.join(hta_dir, "critical_path.json")
    if os.path.exists(hc):
        ours = {r["rank"]: r for r in _rows(os.path.join(ours_dir, "critical_path.csv")) or []}
        for rank, want in json.load(open(hc)).items():
            got = ours.get(rank)
            if "error" in want or got is None:
                continue  # HTA fails there (documented): ours answers or says why
            if not close(want["length_us"], got["length_us"], 1e-6) or any(
                    not close(want["pct"].get(b, 0.0), got[f"{b}_pct"], 0.01) for b in CP_BOUNDS):
                bad.append(f"critical path rank {rank}: {want} vs {got['length_us']}")
    for f in sorted(os.listdir(hta_dir)):
        if f.startswith("cuda_kernel_launch_stats_rank"):
            check(f, [("correlation", "correlation")],
                  [("cpu_duration", "cpu_duration", 1), ("gpu_duration", "gpu_duration", 1),
                   ("launch_delay", "launch_delay", 1)])
    return bad


def dir_mb(d: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 1e6


HTA_FIVE = "temporal,kernels,idle,overlap,launch"  # HTA's original analyses: the bar's "same analyses"
HTA_MORE = HTA_FIVE + ",queue,membw,stragglers"
HTA_ALL = HTA_MORE + ",critical_path"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def bench_one(label: str, d: str, hta_py: str, work: str, repeat: int, hta_steps: str, ours_py: str,
              baseline: str | None = None) -> dict:
    """HTA (``hta_steps``), ours with the same analyses (--no-critical-path) and ours as run by
    default, alternating, ``repeat`` times each: medians and spreads of wall time and peak RSS;
    with ``baseline`` (another checkout), also ours from there with the same analyses ("base")."""
    hdir = os.path.join(work, label, "hta")
    os.makedirs(hdir, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=ROOT)
    if STDLIB_JSON:
        env["OTELGPU_TRACE_JSON"] = "json"
    ours = [ours_py, "-m", "otel_gpu.trace", "analyze", d, "--quiet", "--csv"]
    runs = {"hta": ([hta_py, "-c", HTA_SCRIPT, d, hdir, hta_steps], dict(os.environ, PYTHONWARNINGS="ignore")),
            "same": (ours + [os.path.join(work, label, "same"), "--no-critical-path"], env),
            "default": (ours + [os.path.join(work, label, "default")], env)}
    if baseline:
        runs["base"] = (ours + [os.path.join(work, label, "base"), "--no-critical-path"], dict(env, PYTHONPATH=baseline))
    got: dict[str, list] = {k: [] for k in runs}
    for _ in range(repeat):
        for who, (cmd, e) in runs.items():
            wall, rss, rc = measure(cmd, e, cwd=baseline if who == "base" else ROOT)
            if rc:
                raise SystemExit(f"{who} failed on {d} (exit {rc})")
            got[who].append((wall, rss))
    out = {"set": label, "mb": dir_mb(d), "ranks": len(os.listdir(d)), "runs": repeat}
    for who, xs in got.items():
        walls, rsss = [x[0] for x in xs], [x[1] for x in xs]
        out[f"{who}_s"], out[f"{who}_s_spread"] = _median(walls), (min(walls), max(walls))
        out[f"{who}_mb"] = _median(rsss)
    diffs = compare(hdir, os.path.join(work, label, "default" if "critical_path" in hta_steps else "same"))
    out.update(identical=not diffs, diffs=diffs[:3])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=os.path.join(ROOT, "..", "shared", "data", "traces"))
    ap.add_argument("--hta-venv", default="/tmp/hta-venv")
    ap.add_argument("--baseline", metavar="TREE", help="also time ours from this checkout (e.g. a `git archive` of an "
                                                        "older commit), same analyses, in the same alternation")
    ap.add_argument("--ours-venv", default="/tmp/otelgpu-trace-venv",
                    help="venv ours runs from (made when missing); '' for this Python")
    ap.add_argument("--ranks", default="64", help="replicated multi-rank sizes (of the largest multi-rank set)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="generated sets, comma-separated ('' for none): "
                    + ", ".join(SHAPES))
    ap.add_argument("--shape-ranks", type=int, default=64, help="ranks of each generated set")
    ap.add_argument("--seed", type=int, default=0, help="seed of the generated sets")
    ap.add_argument("--big", default="32", help="rank counts of the large set: --big-from's events repeated "
                    "--big-grow times per rank (32: about 3.9 M events); '' for none")
    ap.add_argument("--big-from", default="hta_nccl_data")
    ap.add_argument("--big-grow", type=int, default=3)
    ap.add_argument("--grow", default="", help="single-file sizes: events of --grow-from repeated N times")
    ap.add_argument("--grow-from", default="hta_nccl_data", help="set whose events --grow repeats")
    ap.add_argument("--shared", action="store_true", help="also the largest shared single- and multi-rank sets")
    ap.add_argument("--hta-analyses", choices=("five", "more", "all"), default="five",
                    help="what HTA runs, timed: its five original analyses (the bar's 'same analyses'), "
                    "plus queue length, memory bandwidth and potential stragglers, or all with every "
                    "rank's critical path")
    ap.add_argument("--repeat", type=int, default=3, help="runs per tool and set; medians are shown")
    ap.add_argument("--work", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else None,
                    help="folder for the generated sets and both tools' CSV output (default /dev/shm: a tmpfs, so "
                    "ours' syncfs of its outputs does not wait behind other processes' writes to a shared disk)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--stdlib-json", action="store_true", help="ours with the standard library's JSON decoder")
    args = ap.parse_args()
    if TIME is None:
        raise SystemExit("needs GNU time (/usr/bin/time, Debian package 'time') to measure peak RSS")
    global STDLIB_JSON
    STDLIB_JSON = args.stdlib_json
    hta_steps = {"five": HTA_FIVE, "more": HTA_MORE, "all": HTA_ALL}[args.hta_analyses]
    hta_py = ensure_hta(args.hta_venv)
    ours_py = ensure_ours(args.ours_venv) if args.ours_venv else sys.executable
    sets = {}
    for dp, _, files in os.walk(args.data):
        if any(f.endswith((".json", ".gz")) for f in files):
            sets[os.path.relpath(dp, args.data)] = dp
    gpu_sets = {k: v for k, v in sets.items() if "cpu_only" not in k}
    largest = max(gpu_sets, key=lambda k: dir_mb(gpu_sets[k]))
    multi = max((k for k in gpu_sets if len(os.listdir(gpu_sets[k])) > 1), key=lambda k: dir_mb(gpu_sets[k]))
    work = tempfile.mkdtemp(prefix="bench-trace-", dir=args.work)
    runs = [(largest, gpu_sets[largest]), (multi, gpu_sets[multi])] if args.shared else []
    for n in [int(x) for x in args.ranks.split(",") if x]:
        runs.append((f"{multi} x{n} ranks", replicate(gpu_sets[multi], n, os.path.join(work, f"rep{n}"))))
    for shape in [x for x in args.shapes.split(",") if x]:
        if shape not in SHAPES:
            raise SystemExit(f"--shapes: unknown shape {shape!r} (one of {', '.join(SHAPES)})")
        runs.append((f"{shape} x{args.shape_ranks} ranks (seed {args.seed})",
                     write_set(shape, os.path.join(work, f"shape-{shape}"), args.shape_ranks, args.seed)))
    if args.big and args.big_from in gpu_sets:
        one = grow(gpu_sets[args.big_from], args.big_grow, os.path.join(work, "big1"))
        for n in [int(x) for x in args.big.split(",") if x]:
            runs.append((f"{args.big_from} x{args.big_grow} events, x{n} ranks",
                         replicate(one, n, os.path.join(work, f"big{n}"))))
    if args.grow_from in gpu_sets:
        for n in [int(x) for x in args.grow.split(",") if x]:
            runs.append((f"{args.grow_from} x{n} in one file",
                         grow(gpu_sets[args.grow_from], n, os.path.join(work, f"grow{n}"))))
    try:
        return _run_sets(args, runs, work, hta_py, ours_py, hta_steps)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_sets(args, runs: list, work: str, hta_py: str, ours_py: str, hta_steps: str) -> int:
    results = []
    # our modules byte-compiled, as pip compiled HTA's into its venv (with PYTHONDONTWRITEBYTECODE set,
    # an editable checkout would otherwise compile every module from source in every run: ~60 ms)
    for tree in [ROOT] + ([args.baseline] if args.baseline else []):
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(tree, "otel_gpu")], check=True)
    backend = subprocess.run([ours_py, "-c", "from otel_gpu.trace.decoders import JSON_BACKEND as b; "
                              "from otel_gpu.trace.gz import GZIP_BACKEND as g; print(b, g)"],
                             capture_output=True, text=True, cwd=ROOT,
                             env=dict(os.environ, PYTHONPATH=ROOT,
                                      **({"OTELGPU_TRACE_JSON": "json"} if STDLIB_JSON else {}))
                             ).stdout.split()
    print(f"ours: python -m otel_gpu.trace analyze DIR --csv OUT --quiet [--no-critical-path] (JSON decoder: "
          f"{backend[0]}, gzip: {backend[1]}, byte-compiled, {ours_py}); HTA 0.5.0 ({hta_py}): {hta_steps}; median of "
          f"{args.repeat} runs each, alternating; sets and outputs under {work}; {os.cpu_count()} CPUs")
    print(f"{'set':<40} {'ranks':>5} {'MB':>6} {'HTA s':>7} {'same s':>7} {'dflt s':>7} {'same x':>7} "
          f"{'dflt x':>7} {'dflt/same':>9} {'HTA MB':>7} {'same MB':>7} {'dflt MB':>7} {'mem same':>8} "
          f"{'mem dflt':>8}  numbers")
    for label, d in runs:
        r = bench_one(label.replace("/", "_").replace(" ", "_").replace(",", ""), d, hta_py, work, args.repeat,
                      hta_steps, ours_py, args.baseline)
        r["set"] = label
        results.append(r)
        print(f"{label:<40} {r['ranks']:>5} {r['mb']:>6.1f} {r['hta_s']:>7.2f} {r['same_s']:>7.2f} "
              f"{r['default_s']:>7.2f} {r['hta_s'] / r['same_s']:>6.1f}x {r['hta_s'] / r['default_s']:>6.1f}x "
              f"{r['default_s'] / r['same_s']:>9.2f} {r['hta_mb']:>7.0f} {r['same_mb']:>7.0f} {r['default_mb']:>7.0f} "
              f"{r['same_mb'] / r['hta_mb']:>8.2f} {r['default_mb'] / r['hta_mb']:>8.2f}  "
              f"{'identical' if r['identical'] else 'DIFFER ' + str(r['diffs'])}", flush=True)
        wall_x, mem_x = r["hta_s"] / r["same_s"], r["same_mb"] / r["hta_mb"]
        print(f"    bar (same analyses: >= 10x HTA's wall, <= 0.25x its peak memory): wall {wall_x:.1f}x "
              f"{'met' if wall_x >= 10 else 'MISSED'}, memory {mem_x:.2f}x {'met' if mem_x <= 0.25 else 'MISSED'}",
              flush=True)
        if args.baseline:
            print(f"    ours from {args.baseline}, same analyses: {r['base_s']:.2f} s ({r['base_s_spread'][0]:.2f}-"
                  f"{r['base_s_spread'][1]:.2f}), {r['base_mb']:.0f} MB; this tree / that one: "
                  f"{r['same_s'] / r['base_s']:.3f} (wall), {r['same_mb'] / r['base_mb']:.3f} (memory)", flush=True)
        print("    spread (min-max s): " + ", ".join(
            f"{who} {r[who + '_s_spread'][0]:.2f}-{r[who + '_s_spread'][1]:.2f}" for who in ("hta", "same", "default")),
            flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0 if all(r["identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
