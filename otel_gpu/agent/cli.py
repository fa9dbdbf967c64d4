"""`otel-gpu agent` and `otel-gpu doctor`: flags and environment -> a running node agent.

The agent's --help text is AGENT_HELP (what the agent does, then its settings).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Mapping

from .. import names
from ..errors import UsageError
from ..errors import ConfigError
from ..export import OtlpSettings, bounded_number, otlp_settings
from ..safe_text import visible
from ..values import bounded_int
from .node import NodeConfig, build_node

EMBEDDED_PROMETHEUS_PORT = 9464   # the OpenTelemetry Prometheus exporter's usual port
FLUSH_TIMEOUT_S = 5.0
MAX_PID = 4194304                 # Linux's largest pid_max (2**22)

AGENT_HELP = """Run the node agent: read this node's GPUs (NVML; GPM counters on Hopper+),
network links, disks, CPU, memory and training processes; export them over
OTLP (when OTEL_EXPORTER_OTLP_ENDPOINT is set) or on a Prometheus endpoint
(default 127.0.0.1:9464, with a live view of the node on a terminal).

Settings (flags win over the environment):
  OTELGPU_INTERVAL         sampling interval, seconds (0.1 - 3600, default 1)
  OTELGPU_PROMETHEUS_PORT  serve a Prometheus scrape endpoint on this port
  OTELGPU_PROMETHEUS_HOST  its bind address (default, and when empty, 127.0.0.1)
  OTELGPU_CHECKPOINT_DIR   checkpoint folders whose filesystem is watched
                           (':'-separated)
  OTELGPU_PROCESSES        command-line substrings of the training processes
                           to watch (','-separated)
  OTELGPU_FAKE_GPUS        read N fake Hopper GPUs instead of NVML (demos)
  OTELGPU_KUBELET_SOCKET   the kubelet's PodResources socket: label GPUs assigned
                           to pods (also while idle) with pod, namespace, container
"""


@dataclass(frozen=True)
class AgentConfig:
    node: NodeConfig
    interval_s: float
    otlp: OtlpSettings
    prometheus_port: int | None
    prometheus_host: str
    live: bool
    parent_pid: int | None = None   # stop when this process is gone (`otel-gpu run` passes its pid)


def _number(raw: str, what: str, lo: float, hi: float, kind=float):
    try:
        return bounded_number(raw, what, lo, hi, kind)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def agent_config(args, env: Mapping[str, str], stdout_is_tty: bool) -> AgentConfig:
    """Validate flags and environment into an AgentConfig; UsageError (exit 2) on any bad value."""
    interval = args.interval if args.interval is not None else env.get("OTELGPU_INTERVAL", "1")
    interval_s = _number(str(interval), "--interval", 0.1, 3600)
    port_raw = args.prometheus_port if args.prometheus_port is not None else env.get("OTELGPU_PROMETHEUS_PORT")
    port = _number(str(port_raw), "--prometheus-port", 1, 65535, int) if port_raw not in (None, "") else None
    try:
        otlp = otlp_settings(env, default_interval_s=max(10.0, interval_s))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    embedded = otlp.endpoint is None and port is None
    if embedded:
        port = EMBEDDED_PROMETHEUS_PORT
    dirs = tuple(args.checkpoint_dir or [d for d in env.get("OTELGPU_CHECKPOINT_DIR", "").split(os.pathsep) if d])
    for d in dirs:
        if not Path(d).is_dir():
            raise UsageError(f"--checkpoint-dir {d!r}: not a directory")
    patterns = tuple(args.process or [p for p in env.get("OTELGPU_PROCESSES", "").split(",") if p])
    fake = args.fake_gpus if args.fake_gpus is not None else env.get("OTELGPU_FAKE_GPUS", "0")
    fake_gpus = _number(str(fake), "--fake-gpus", 0, 64, int)
    live = args.live if args.live is not None else (embedded and stdout_is_tty)
    for flag, root in (("--proc-root", args.proc_root), ("--sys-root", args.sys_root)):
        if not Path(root).is_dir():
            raise UsageError(f"{flag} {root!r}: not a directory")
    kubelet = kubelet_socket(args.kubelet_socket if args.kubelet_socket is not None else
                             env.get("OTELGPU_KUBELET_SOCKET", ""))
    node = NodeConfig(proc_root=args.proc_root, sys_root=args.sys_root, checkpoint_dirs=dirs,
                      process_patterns=patterns, fake_gpus=fake_gpus, gpus=not args.no_gpu, interval_s=interval_s,
                      job_pid=getattr(args, "parent_pid", None), kubelet_socket=kubelet)
    host = (env.get("OTELGPU_PROMETHEUS_HOST") or "").strip() or "127.0.0.1"   # empty: the default, never 0.0.0.0
    return AgentConfig(node, interval_s, otlp, port, host, live,
                       getattr(args, "parent_pid", None))


def kubelet_socket(raw: str) -> str | None:
    """--kubelet-socket / OTELGPU_KUBELET_SOCKET: None when empty; UsageError unless a unix socket."""
    path = raw.strip()
    if not path:
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError) as exc:   # ValueError: a NUL in the path
        raise UsageError(f"--kubelet-socket {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise UsageError(f"--kubelet-socket {path!r}: not a unix socket")
    return path


def register(sub) -> None:
    p = sub.add_parser("agent", help="run the node agent (GPU, NIC, storage, host, process metrics)",
                       description=AGENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--interval", type=str, default=None, help="sampling interval in seconds (default 1, min 0.1)")
    p.add_argument("--prometheus-port", type=str, default=None, help="serve a Prometheus endpoint on this port")
    p.add_argument("--checkpoint-dir", action="append", help="watch this directory's filesystem (repeatable)")
    p.add_argument("--process", action="append", help="watch processes whose command line contains this (repeatable)")
    p.add_argument("--fake-gpus", type=str, default=None, help="read N fake Hopper GPUs instead of NVML")
    p.add_argument("--no-gpu", action="store_true", help="do not read GPUs")
    p.add_argument("--live", dest="live", action="store_true", default=None, help="show the live terminal view")
    p.add_argument("--no-live", dest="live", action="store_false", help="never show the live terminal view")
    p.add_argument("--proc-root", default="/proc", help="where the host's /proc is mounted (containers)")
    p.add_argument("--sys-root", default="/sys", help="where the host's /sys is mounted (containers)")
    p.add_argument("--kubelet-socket", default=None, metavar="PATH",
                   help="the kubelet's PodResources socket (e.g. /var/lib/kubelet/pod-resources/kubelet.sock): label "
                        "GPUs assigned to pods, also while idle; also OTELGPU_KUBELET_SOCKET")
    p.add_argument("--parent-pid", type=bounded_int(1, MAX_PID), default=None, metavar="PID",
                   help="stop (flushing as on SIGTERM) when process PID ends or is no longer the parent; the "
                        "processes PID starts (but otel-gpu's own) are the job's: their CPU, memory and I/O are read")
    p.add_argument("--once", action="store_true", help="take one snapshot and exit")
    p.add_argument("--json", action="store_true", help="with --once: print the snapshot as JSON")
    p.set_defaults(func=run_agent)

    d = sub.add_parser("doctor", help="what this node supports, and what is unreadable and why",
                       description="Probe every source the agent reads on this node and print what it supports, "
                                   "what is unreadable and why, and what each NVML field costs here and how often "
                                   "the agent reads it. Exit 0 even when some sources are unreadable.")
    d.add_argument("--json", action="store_true", help="print the report as JSON (exact numbers)")
    d.add_argument("--fake-gpus", type=str, default=None, metavar="N",
                   help="probe N fake Hopper GPUs instead of NVML (demos, tests); also OTELGPU_FAKE_GPUS")
    d.add_argument("--no-gpu", action="store_true", help="do not probe GPUs")
    d.add_argument("--kubelet-socket", default=None, metavar="PATH",
                   help="also ask the kubelet which pod holds each GPU (compared per job); also OTELGPU_KUBELET_SOCKET")
    d.set_defaults(func=run_doctor)


def run_agent(args) -> int:
    config = agent_config(args, os.environ, sys.stdout.isatty())
    if args.json and not args.once:
        raise UsageError("--json needs --once")
    node = build_node(replace(config.node, interval_s=0.25) if args.once else config.node)   # --once: reads 0.25 s apart
    for note in node.notes:
        print(f"otel-gpu agent: {visible(note)}", file=sys.stderr)   # notes can quote /sys and /proc names
    try:
        if args.once:
            return _once(node, as_json=args.json)
        from .runtime import AgentRuntime
        runtime = AgentRuntime(config, node)
        return runtime.run_until_signal()
    finally:
        node.close()


def _once(node, as_json: bool) -> int:
    from .sampler import Sampler
    from ..identity import point_attributes, resource_attributes
    from .store import Store

    sampler = Sampler(node.sources, Store(window_s=1.0), interval_s=0.25)
    for source in node.sources:   # two reads: rates and GPM need a previous sample
        sampler.read_once(source)
    time.sleep(0.25)
    point = point_attributes(resource_attributes(os.environ))
    rows = []
    for source in node.sources:
        rows += [{**r.to_json(), "attributes": {**point, **r.attributes}} for r in sampler.read_once(source)]
    for name, h in sampler.health.items():
        rows.append({"name": names.SOURCE_UP.name, "unit": names.SOURCE_UP.unit, "value": float(h.up),
                     "attributes": {**point, names.SOURCE: name}})
    for source in node.sources:   # what a source dropped, by reason (NVML PIDs that are no process here)
        for why, n in sorted(getattr(source, "error_reasons", {}).items()):
            rows.append({"name": names.SOURCE_ERRORS.name, "unit": names.SOURCE_ERRORS.unit, "value": float(n),
                         "attributes": {**point, names.SOURCE: source.name, names.ERROR_TYPE: why}})
    if as_json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        for row in rows:   # names and attributes come from the system: shown, never obeyed
            attrs = ",".join(f"{k}={v}" for k, v in row["attributes"].items() if k != "host.name")
            print(visible(f"{row['name']}{{{attrs}}} {row['value']:g} {row['unit']}"))
    return 0


def run_doctor(args) -> int:
    from ..readings import describe

    env = dict(os.environ)
    fake = args.fake_gpus if args.fake_gpus is not None else env.get("OTELGPU_FAKE_GPUS", "0")
    kubelet = kubelet_socket(args.kubelet_socket if args.kubelet_socket is not None else
                             env.get("OTELGPU_KUBELET_SOCKET", ""))
    node = build_node(NodeConfig(fake_gpus=_number(str(fake), "--fake-gpus", 0, 64, int), gpus=not args.no_gpu,
                                 kubelet_socket=kubelet))
    try:
        for s in node.sources:   # NVML: calls after the first timed, so its cost table shows per-call costs
            time_calls = getattr(s, "time_calls", None)
            if callable(time_calls):
                time_calls()
        report = {"notes": node.notes, "sources": {s.name: describe(s) for s in node.sources}}
    finally:
        node.close()
    if args.json:
        print(json.dumps(report, indent=1, default=str))
        return 0
    from rich.console import Console

    from .doctor_view import doctor_view

    Console().print(doctor_view(report))
    return 0


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGINT / SIGTERM set `stop`; the agent then flushes and exits 0."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
