"""Real servers for tests: Prometheus, VictoriaMetrics, Alertmanager and node_exporter on free loopback ports.

Each server is started as a child process with its log in a file, waited on until its readiness
endpoint answers (the log tail is shown when it does not), and stopped by PID (terminate, wait,
kill). Nothing here is mocked: these are the binaries the product talks to in production.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import httpx
import yaml

T = TypeVar("T")

CACHE = Path(os.environ.get("OTELGPU_CACHE") or Path.home() / ".cache" / "otel-gpu")
PROMETHEUS_BIN = os.environ.get("OTELGPU_PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
VICTORIA_METRICS_BIN = os.environ.get("OTELGPU_VICTORIA_METRICS") or str(
    CACHE / "victoria-metrics" / "usr" / "bin" / "victoria-metrics"
)
NODE_EXPORTER_BIN = (
    os.environ.get("OTELGPU_NODE_EXPORTER")
    or shutil.which("prometheus-node-exporter")
    or "/usr/bin/prometheus-node-exporter"
)
LIGHT_COLLECTORS = ("cpu", "meminfo", "diskstats", "netdev")
PROMETHEUS3_BIN = os.environ.get("OTELGPU_PROMETHEUS3") or str(CACHE / "prometheus3" / "usr" / "bin" / "prometheus")
PROMTOOL3_BIN = os.environ.get("OTELGPU_PROMTOOL3") or str(CACHE / "prometheus3" / "usr" / "bin" / "promtool")
ALERTMANAGER_BIN = (
    os.environ.get("OTELGPU_ALERTMANAGER")
    or shutil.which("prometheus-alertmanager")
    or "/usr/bin/prometheus-alertmanager"
)
AMTOOL_BIN = os.environ.get("OTELGPU_AMTOOL") or shutil.which("amtool") or "/usr/bin/amtool"

_running: set["Server"] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1) -> T:
    """Call ``check`` until it returns something truthy; raise TimeoutError naming ``what``.

    Exceptions from ``check`` count as "not yet"; the last one is quoted in the error.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - remembered and reported below
            last = exc
        if time.monotonic() >= deadline:
            why = f" (last error: {last})" if last else ""
            raise TimeoutError(f"{what} not reached within {timeout:g} s{why}")
        time.sleep(interval)


def require_binary(binary: str, what: str) -> None:
    """Skip (locally) or fail (in CI) when ``binary`` is not an executable file."""
    import pytest

    if os.path.isfile(binary) and os.access(binary, os.X_OK):
        return
    reason = f"{what} binary not found at {binary}; run `bash .ci/install.sh`"
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}", pytrace=False)
    pytest.skip(reason)


class ServerError(RuntimeError):
    """A server did not start or become ready; the message carries its log tail."""


class Server:
    """A child process serving HTTP on 127.0.0.1:<port>, with its log in ``<tmpdir>/<name>.log``."""

    name = "server"
    ready_path = "/"
    start_timeout = 30.0

    def __init__(self, binary: str, tmpdir: str | os.PathLike, port: int | None = None):
        self.binary = str(binary)
        self.tmpdir = Path(tmpdir)
        self.tmpdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.log_path = self.tmpdir / f"{self.name}.log"
        self.proc: subprocess.Popen | None = None

    # -- to be filled in by subclasses
    def args(self) -> list[str]:
        raise NotImplementedError

    # -- public API
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host_port(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServerError(f"{self.name} is not running")
        return self.proc.pid

    @classmethod
    def available(cls, binary: str) -> bool:
        return os.path.isfile(binary) and os.access(binary, os.X_OK)

    def start(self) -> "Server":
        """Start the process and wait until it is ready; a port clash is retried on a new port."""
        if not self.available(self.binary):
            raise ServerError(f"{self.name}: binary {self.binary} is missing (run .ci/install.sh)")
        for attempt in range(3):
            self._spawn()
            try:
                self._wait_ready()
                return self
            except ServerError:
                self.stop()
                if attempt == 2 or "address already in use" not in self.log_tail().lower():
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate by PID, wait up to ``timeout`` seconds, then kill."""
        proc, self.proc = self.proc, None
        _running.discard(self)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def get(self, path: str, **params) -> httpx.Response:
        return httpx.get(self.url + path, params=params or None, timeout=10.0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals
    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, *self.args()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.tmpdir,
                start_new_session=True,  # a Ctrl-C in the test run does not reach it; we stop it
            )
        _running.add(self)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            assert self.proc is not None
            code = self.proc.poll()
            if code is not None:
                raise ServerError(
                    f"{self.name} exited with status {code} before it was ready; log tail:\n{self.log_tail()}"
                )
            try:
                r = httpx.get(self.url + self.ready_path, timeout=2.0)
                if r.status_code == 200:
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        raise ServerError(
            f"{self.name} at {self.url} not ready within {self.start_timeout:g} s ({last}); "
            f"log tail:\n{self.log_tail()}"
        )


class Prometheus(Server):
    """Prometheus with the remote-write receiver and the lifecycle API (``POST /-/reload``).

    Data lives in ``<tmpdir>/data``: backfill blocks there (``promtool tsdb create-blocks-from``)
    before ``start()`` to query fixed series.
    """

    name = "prometheus"
    ready_path = "/-/ready"

    def __init__(
        self,
        config_yaml_text: str = "global:\n  scrape_interval: 1s\n",
        tmpdir: str | os.PathLike = ".",
        extra_args: Sequence[str] = (),
        binary: str = PROMETHEUS_BIN,
        port: int | None = None,
    ):
        super().__init__(binary, tmpdir, port)
        self.config_path = self.tmpdir / "prometheus.yml"
        self.data_dir = self.tmpdir / "data"
        self.extra_args = list(extra_args)
        self.config = yaml.safe_load(config_yaml_text) or {}
        self._write_config()

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-remote-write-receiver",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]

    def add_scrape_target(
        self, job: str, host_port: str, interval: str = "1s", metrics_path: str = "/metrics", timeout: float = 20.0
    ) -> None:
        """Scrape ``host_port`` as ``job`` every ``interval``; return once the target is up.

        Takes about 5 s: Prometheus passes discovery changes to its scraper at most every 5 s.
        """
        jobs = [j for j in self.config.get("scrape_configs") or [] if j.get("job_name") != job]
        jobs.append(
            {
                "job_name": job,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "metrics_path": metrics_path,
                "static_configs": [{"targets": [host_port]}],
            }
        )
        self.config["scrape_configs"] = jobs
        self.reload()
        wait_until(lambda: self._target_health(job, host_port) == "up", timeout, f"target {job} {host_port} up")

    def remove_scrape_target(self, job: str) -> None:
        self.config["scrape_configs"] = [
            j for j in self.config.get("scrape_configs") or [] if j.get("job_name") != job
        ]
        self.reload()

    def reload(self) -> None:
        """Write the config and ask the running server to reload it."""
        self._write_config()
        if self.proc is not None:
            r = httpx.post(self.url + "/-/reload", timeout=10.0)
            if r.status_code != 200:
                raise ServerError(f"prometheus reload failed: HTTP {r.status_code} {r.text.strip()}")

    def _write_config(self) -> None:
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def _target_health(self, job: str, host_port: str) -> str | None:
        data = self.get("/api/v1/targets", state="active").json()["data"]
        for t in data["activeTargets"]:
            if t["labels"].get("job") == job and t["labels"].get("instance") == host_port:
                return t["health"]
        return None


class VictoriaMetrics(Server):
    """Single-node VictoriaMetrics: OTLP/HTTP at ``/opentelemetry/v1/metrics``, PromQL at ``/api/v1``.

    Flags make a fresh sample queryable at once: no 30 s latency offset, no response cache.
    Ingested samples sit in memory buffers first: a new series shows up in queries only after
    ~10 s and a new sample of a known series after ~2-3 s, unless ``flush()`` is called after the
    push (then < 1 s; measured on 1.145).
    """

    name = "victoria-metrics"
    ready_path = "/health"

    def __init__(
        self,
        tmpdir: str | os.PathLike,
        extra_args: Sequence[str] = (),
        binary: str = VICTORIA_METRICS_BIN,
        port: int | None = None,
    ):
        super().__init__(binary, tmpdir, port)
        self.data_dir = self.tmpdir / "data"
        self.extra_args = list(extra_args)

    def args(self) -> list[str]:
        return [
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.data_dir}",
            "-opentelemetry.usePrometheusNaming",
            "-search.latencyOffset=0s",
            "-search.disableCache",
            "-loggerLevel=WARN",
            *self.extra_args,
        ]

    @property
    def otlp_metrics_url(self) -> str:
        return f"{self.url}/opentelemetry/v1/metrics"

    def flush(self) -> None:
        """Make every ingested sample searchable now (``/internal/force_flush``)."""
        r = self.get("/internal/force_flush")
        if r.status_code != 200:
            raise ServerError(f"victoria-metrics force_flush failed: HTTP {r.status_code}")


class Alertmanager(Server):
    """Alertmanager with ``config_yaml_text`` as its configuration, gossip off (one instance), state in tmpdir."""

    name = "alertmanager"
    ready_path = "/-/ready"

    def __init__(self, config_yaml_text: str, tmpdir: str | os.PathLike, binary: str = ALERTMANAGER_BIN,
                 port: int | None = None):
        super().__init__(binary, tmpdir, port)
        self.config_path = self.tmpdir / "alertmanager.yml"
        self.config_path.write_text(config_yaml_text)

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config_path}",
            f"--storage.path={self.tmpdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]


class NodeExporter(Server):
    """prometheus-node-exporter without the systemd collector; ``collectors`` restricts the set.

    ``collectors=LIGHT_COLLECTORS`` keeps only cpu, meminfo, diskstats and netdev.
    """

    name = "node-exporter"
    ready_path = "/metrics"

    def __init__(
        self,
        port: int | None = None,
        tmpdir: str | os.PathLike | None = None,
        collectors: Iterable[str] | None = None,
        extra_args: Sequence[str] = (),
        binary: str = NODE_EXPORTER_BIN,
    ):
        self._own_tmpdir = tmpdir is None
        if tmpdir is None:
            import tempfile

            tmpdir = tempfile.mkdtemp(prefix="node-exporter-")
        super().__init__(binary, tmpdir, port)
        self.collectors = list(collectors) if collectors is not None else None
        self.extra_args = list(extra_args)

    def args(self) -> list[str]:
        args = [f"--web.listen-address=127.0.0.1:{self.port}"]
        if self.collectors is None:
            args.append("--no-collector.systemd")
        else:
            args.append("--collector.disable-defaults")
            args += [f"--collector.{c}" for c in self.collectors]
        return args + self.extra_args

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)
        if self._own_tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)


def _stop_all() -> None:
    for server in list(_running):
        server.stop()


atexit.register(_stop_all)
