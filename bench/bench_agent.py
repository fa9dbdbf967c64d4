"""Agent cost side by side with node_exporter, in one run.

For each sampling interval (1 s and 100 ms): the agent (fake Hopper GPUs + every real host
source, Prometheus endpoint), the agent with --no-gpu (the host sources alone, the like-for-like
peer of node_exporter) and node_exporter (cpu, meminfo, diskstats, netdev collectors only) run at
the same time for DURATION seconds, all scraped by the same Prometheus at that interval. CPU
seconds and peak RSS come from /proc/<pid>; both are printed as ratios to node_exporter's.

The fake GPUs' NVML calls cost what they cost on a real H100 (fake_nvml.H100_COSTS).
`--real-gpus` reads the node's real GPUs through NVML instead (run it on a GPU node); `--stub-gpus N`
reads N GPUs through the real pynvml bound to a C stand-in for libnvidia-ml charging the same H100
costs (bench/nvml_stub: pynvml's own Python and ctypes, which the fake replaces, are timed too).
Prometheus scrapes where it is installed, else VictoriaMetrics' own scraper (`--scraper`).

    python bench/bench_agent.py [--duration 60] [--intervals 1,0.1] [--repeat 3]
                                [--gpus 8 | --real-gpus | --stub-gpus 8 [--beside-fake]]
                                [--baseline OTHER_CHECKOUT] [--scraper auto|prometheus|victoria-metrics]

`--baseline` runs another checkout's agent beside this one's (same GPUs, same scrapes, same
moment): on a shared machine whose load moves node_exporter's cost by 10-20% between runs, a
before/after comparison is only fair within one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.nvml_stub.build import NoCompiler, build  # noqa: E402
from tests.servers import (PROMETHEUS_BIN, NodeExporter, Prometheus, Server, VictoriaMetrics,  # noqa: E402
                           free_port, wait_until)

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (and its reaped children), seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _serving(httpx, url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def start_agent(interval: float, *flags: str, root: Path = ROOT,
                extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    """The agent of the checkout at `root` (this one by default)."""
    port = free_port()
    # that checkout's package first; the rest of PYTHONPATH kept (where the dependencies are installed
    # beside the interpreter's, as on the GPU machine, the agent could not start without it)
    path = [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), **(extra_env or {})}
    proc = subprocess.Popen([sys.executable, "-m", "otel_gpu", "agent", "--no-live", *flags,
                             "--interval", str(interval), "--prometheus-port", str(port)],
                            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, port


def stop_agent(proc: subprocess.Popen, interval: float) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        print(f"agent did not exit within 10 s of SIGTERM (interval {interval} s)", file=sys.stderr)
        proc.kill()


class PrometheusScraper:
    """Prometheus scraping every target at `interval` (the build machines have it)."""

    def __init__(self, targets: dict[str, str], interval: str, tmp: Path):
        self.server = Prometheus(f"global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n", tmp).start()
        for job, host_port in targets.items():
            self.server.add_scrape_target(job, host_port, interval=interval, timeout=60)

    def scrapes(self, job: str, seconds: float) -> float:
        """Scrapes of `job` in the last `seconds` (its `up` samples)."""
        got = self.server.get("/api/v1/query", query=f'count_over_time(up{{job="{job}"}}[{int(seconds)}s])')
        result = got.json()["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    def stop(self) -> None:
        self.server.stop()


class VictoriaMetricsScraper(PrometheusScraper):
    """VictoriaMetrics' own Prometheus scraper (`-promscrape.config`), where Prometheus is not
    installed (the GPU machine carries VictoriaMetrics). Like Prometheus it asks for gzip."""

    def __init__(self, targets: dict[str, str], interval: str, tmp: Path):
        tmp.mkdir(parents=True, exist_ok=True)
        config = tmp / "scrape.yml"
        jobs = [{"job_name": job, "scrape_interval": interval, "scrape_timeout": interval,
                 "static_configs": [{"targets": [host_port]}]} for job, host_port in targets.items()]
        import yaml
        config.write_text(yaml.safe_dump({"scrape_configs": jobs}, sort_keys=False))
        self.server = VictoriaMetrics(tmp, extra_args=[f"-promscrape.config={config}"]).start()
        for job in targets:
            wait_until(lambda: self._up(job), 60, f"target {job} up")

    def _up(self, job: str) -> bool:
        self.server.flush()
        result = self.server.get("/api/v1/query", query=f'up{{job="{job}"}}').json()["data"]["result"]
        return bool(result) and result[0]["value"][1] == "1"

    def scrapes(self, job: str, seconds: float) -> float:
        self.server.flush()
        return super().scrapes(job, seconds)


def scraper_kind(choice: str) -> str:
    """'prometheus' or 'victoria-metrics': `choice`, or for 'auto' Prometheus where it is installed."""
    if choice != "auto":
        return choice
    return "prometheus" if Server.available(PROMETHEUS_BIN) else "victoria-metrics"


def build_stub(folder: Path) -> Path:
    """bench/nvml_stub/stub_nvml.c compiled into `folder`; returns `folder` (for LD_LIBRARY_PATH)."""
    return build(folder).parent


def measure(interval: float, duration: float, tmp: Path, gpus: str,
            baseline: Path | None = None, scraper: str = "prometheus",
            stub: Path | None = None, beside_fake: int = 0) -> dict[str, dict[str, float]]:
    """`gpus`: a count of fake GPUs, or 'real' for the node's GPUs through NVML (with `stub`, the
    stub library in that folder stands in for libnvidia-ml); `baseline`: another checkout whose
    agent runs beside, on the same GPUs (before/after in the same conditions); `beside_fake`: also an
    agent on that many fake GPUs, in the same window."""
    flags = () if gpus == "real" else ("--fake-gpus", gpus)
    env = {"LD_LIBRARY_PATH": str(stub)} if stub is not None else None
    what = ("stub NVML GPUs" if stub else "real GPUs") if gpus == "real" else f"{gpus} fake GPUs"
    agents = {f"agent ({what} + host)": start_agent(interval, *flags, extra_env=env)}
    if baseline is not None:
        agents[f"baseline agent ({what} + host)"] = start_agent(interval, *flags, root=baseline, extra_env=env)
    if beside_fake:
        agents[f"agent ({beside_fake} fake GPUs + host)"] = start_agent(interval, "--fake-gpus", str(beside_fake))
    agents["agent --no-gpu (host only)"] = start_agent(interval, "--no-gpu")
    node = NodeExporter(tmpdir=tmp / f"ne-{interval}", collectors=("cpu", "meminfo", "diskstats", "netdev")).start()
    scrape = f"{int(interval * 1000)}ms"
    prom = None
    try:
        import httpx
        pids = {name: proc.pid for name, (proc, _) in agents.items()} | {"node_exporter": node.pid}
        targets = {}
        for i, (name, (_, port)) in enumerate(agents.items()):
            wait_until(lambda: _serving(httpx, f"http://127.0.0.1:{port}/metrics"), 60, f"{name} endpoint")
            targets[f"agent{i}"] = f"127.0.0.1:{port}"
        targets["node"] = node.host_port
        kind = PrometheusScraper if scraper == "prometheus" else VictoriaMetricsScraper
        prom = kind(targets, scrape, tmp / f"{scraper}-{interval}")
        jobs = dict(zip(pids, targets))
        time.sleep(2)   # all warm: imports done, first scrapes served
        start = {name: cpu_seconds(pid) for name, pid in pids.items()}
        t0 = time.monotonic()
        time.sleep(duration)
        wall = time.monotonic() - t0
        out = {}
        for name, pid in pids.items():
            cpu = cpu_seconds(pid) - start[name]
            out[name] = {"cpu_s": cpu, "cpu_pct_core": 100 * cpu / wall, "peak_rss_mb": peak_rss_mb(pid),
                         "scrapes": prom.scrapes(jobs[name], duration)}
        return out
    finally:
        for proc, _ in agents.values():
            stop_agent(proc, interval)
        node.stop()
        if prom is not None:
            prom.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0, help="seconds measured per interval")
    p.add_argument("--intervals", default="1,0.1", help="sampling/scrape intervals, seconds")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per interval; with more than one, a last row gives the median ratios")
    p.add_argument("--gpus", type=int, default=8, help="fake GPUs (H100 call costs) for the agent to read")
    p.add_argument("--real-gpus", action="store_true", help="read this node's GPUs through NVML (a GPU node)")
    p.add_argument("--stub-gpus", type=int, default=None, metavar="N",
                   help="read N GPUs through pynvml and a C stand-in for libnvidia-ml with H100 call costs "
                        "(bench/nvml_stub; needs gcc): the agent's real-NVML path without a GPU")
    p.add_argument("--beside-fake", action="store_true",
                   help="with --stub-gpus N: also an agent on N fake GPUs (fake_nvml.py) in the same window")
    p.add_argument("--baseline", type=Path, default=None, metavar="CHECKOUT",
                   help="also run the agent of another checkout (e.g. a copy of the previous commit) beside")
    p.add_argument("--scraper", choices=("auto", "prometheus", "victoria-metrics"), default="auto",
                   help="what scrapes every process at the interval (auto: Prometheus where it is installed, "
                        "else VictoriaMetrics' scraper)")
    args = p.parse_args()
    if args.baseline is not None and not (args.baseline / "otel_gpu" / "__main__.py").is_file():
        print(f"--baseline {args.baseline}: not a checkout of this project", file=sys.stderr)
        return 2
    gpus = "real" if args.real_gpus or args.stub_gpus is not None else str(args.gpus)
    if args.beside_fake and args.stub_gpus is None:
        print("--beside-fake: only with --stub-gpus N (an agent on N fake GPUs beside the stand-in's)", file=sys.stderr)
        return 2
    if args.stub_gpus is not None:
        if args.real_gpus or not 1 <= args.stub_gpus <= 64:
            print("--stub-gpus: a count of GPUs from 1 to 64 (the stand-in's most), without --real-gpus",
                  file=sys.stderr)
            return 2
        os.environ["STUB_NVML_GPUS"] = str(args.stub_gpus)
    elif gpus == "real":
        import pynvml
        try:
            pynvml.nvmlInit()
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as err:
            print(f"--real-gpus: NVML cannot start here ({err})", file=sys.stderr)
            return 2
    scraper = scraper_kind(args.scraper)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Agent vs node_exporter, {args.duration:g} s each, "
                        f"scraped by the same {scraper} at the same rate")
    for col in ("interval", "process", "CPU s", "% of one core", "peak RSS MB", "scrapes", "CPU / node_exporter",
                "RSS / node_exporter"):
        table.add_column(col)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            stub = build_stub(Path(tmp) / "nvml-stub") if args.stub_gpus else None
        except NoCompiler as err:
            print(f"--stub-gpus: {err}", file=sys.stderr)
            return 2
        for interval in (float(x) for x in args.intervals.split(",")):
            ratios: dict[str, list[float]] = {}
            for run in range(args.repeat):
                r = measure(interval, args.duration, Path(tmp) / f"run{run}", gpus, args.baseline, scraper, stub,
                            args.stub_gpus if args.beside_fake else 0)
                peer = max(r["node_exporter"]["cpu_s"], 1e-9)
                peer_rss = r["node_exporter"]["peak_rss_mb"]
                for name, m in r.items():
                    ratio = rss_ratio = ""
                    if name != "node_exporter":
                        ratios.setdefault(name, []).append(m["cpu_s"] / peer)
                        ratio = f"{m['cpu_s'] / peer:.2f}"
                        rss_ratio = f"{m['peak_rss_mb'] / peer_rss:.2f}"
                    table.add_row(f"{interval:g} s", name, f"{m['cpu_s']:.2f}", f"{m['cpu_pct_core']:.2f}",
                                  f"{m['peak_rss_mb']:.1f}", f"{m['scrapes']:.0f}", ratio, rss_ratio)
            if args.repeat > 1:
                for name, values in ratios.items():
                    table.add_row(f"{interval:g} s", f"{name}: median of {args.repeat}", "", "", "", "",
                                  f"{statistics.median(values):.2f} ({', '.join(f'{v:.2f}' for v in values)})", "")
    Console(width=150).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
