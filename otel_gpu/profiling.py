"""Continuous profiling of one training rank with pyroscope-io (the only module importing it).

Settings, chosen so a flame graph shows where a rank *waits*, not only where it computes:

- `oncpu=False` (wall clock): a thread blocked in a collective, a lock or I/O is
  sampled in the Python function that blocks, so waiting shows as width;
- `gil_only=False` (all threads): threads that do not hold the GIL (blocked in C,
  autograd and communication threads) are sampled too;
- 50 Hz (`sample_rate`; pyroscope-io's default is 100): walking every thread costs about
  twice pyroscope-io's default mode per sample, so half the rate keeps the sampler's CPU near
  the default's (docs/performance.md has the figures).

Series tags (job, node, rank, local_rank, world_size) are set once in `configure()`;
the phase is a per-thread tag (`add_thread_tag`) set from the same phase hooks as the
metrics, so a flame graph can be cut to "rank 3, backward". Every sample also carries
`thread_id` and `thread_name` (pyroscope-io's report_thread_id/_name), so a report can leave
otel-gpu's own threads out and name threads that run native code only (`NativeThreadNames`).

pyroscope-io is not fork-safe: start it in each rank after spawn, never before a fork.
Configuration: `OTELGPU_PYROSCOPE_URL` (server; unset: no profiling), `OTELGPU_PROFILE`
(`0` turns it off), `OTELGPU_PROFILE_RATE` (Hz), `OTELGPU_PROFILE_MODE` (`wall` | `cpu`),
`OTELGPU_PROFILE_THREADS` (`all` | `gil`), `OTELGPU_PROFILE_UPLOAD_S` (seconds between pushes).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .values import SWITCH_OFF, choice, http_url, number, switch

log = logging.getLogger("otel_gpu.profiling")

PHASE_TAG = "phase"


@dataclass(frozen=True)
class ProfileSettings:
    server: str                 # Pyroscope URL, e.g. http://pyroscope:4040
    app_name: str               # Pyroscope application (service_name)
    tags: dict[str, str] = field(default_factory=dict)
    sample_rate: int = 50       # Hz
    wall: bool = True           # True: wall clock (waits show); False: on-CPU only
    all_threads: bool = True    # True: every thread; False: only the GIL holder
    upload_interval_s: int = 10
    key: str = field(default="", repr=False)   # the recording's per-run secret (sent as RECORD_KEY_HEADER), if any


PROFILE_URL = "OTELGPU_PYROSCOPE_URL"
RECORD_KEY_VAR = "OTELGPU_RECORD_KEY"     # set by `otel-gpu run` for its ranks: the recording's per-run secret
RECORD_KEY_HEADER = "x-otelgpu-key"       # the header that carries it (OTLP and Pyroscope pushes alike)

# every variable the profiler reads: name -> parser(raw, name), each raising ConfigError naming the
# variable and what it expects; an unset or empty variable means the default
PROFILE_VARIABLES: dict[str, Callable[[str, str], object]] = {
    PROFILE_URL: http_url,                                                   # Pyroscope server
    "OTELGPU_PROFILE": switch,                                               # 0: no profiling
    "OTELGPU_PROFILE_MODE": lambda raw, what: choice(raw, what, ("wall", "cpu")),
    "OTELGPU_PROFILE_THREADS": lambda raw, what: choice(raw, what, ("all", "gil")),
    "OTELGPU_PROFILE_RATE": lambda raw, what: number(raw, what, 1, 1000, int),          # Hz
    "OTELGPU_PROFILE_UPLOAD_S": lambda raw, what: number(raw, what, 1, 3600, int),      # seconds
}


def profile_values(env: Mapping[str, str]) -> dict[str, object]:
    """Every profiling variable set (non-empty) in `env`, parsed, whether profiling is on or not;
    ConfigError on the first bad one (`otel-gpu run` checks them all before the command starts)."""
    return {name: parse(env[name], name) for name, parse in PROFILE_VARIABLES.items() if env.get(name, "").strip()}


def profile_settings(env: Mapping[str, str], app_name: str, tags: Mapping[str, str]) -> ProfileSettings | None:
    """Settings from the environment; None when profiling is off. ConfigError on bad values."""
    server = env.get(PROFILE_URL, "").strip()
    if not server or env.get("OTELGPU_PROFILE", "1").strip().lower() in SWITCH_OFF:
        return None
    v = profile_values(env)
    return ProfileSettings(str(v[PROFILE_URL]).rstrip("/"), app_name, dict(tags),
                           int(v.get("OTELGPU_PROFILE_RATE", 50)), v.get("OTELGPU_PROFILE_MODE", "wall") == "wall",
                           v.get("OTELGPU_PROFILE_THREADS", "all") == "all", int(v.get("OTELGPU_PROFILE_UPLOAD_S", 10)),
                           env.get(RECORD_KEY_VAR, "").strip())


DEFAULT_SERVICE = "otelgpu.train"   # a rank's service_name without OTEL_SERVICE_NAME or a job


def service_name(env: Mapping[str, str], job: str | None) -> str:
    """The service_name (Pyroscope application) of a rank's profiles: `OTEL_SERVICE_NAME`, else
    otelgpu.<job>, else otelgpu.train (pure)."""
    return env.get("OTEL_SERVICE_NAME") or (f"otelgpu.{job}" if job else DEFAULT_SERVICE)


def pyroscope_tags(attrs: Mapping[str, str]) -> dict[str, str]:
    """Our attribute keys -> Pyroscope label names (no dots allowed there)."""
    rename = {"otelgpu.job": "job", "host.name": "node", "otelgpu.rank": "rank",
              "otelgpu.local_rank": "local_rank", "otelgpu.world_size": "world_size"}
    return {rename[k]: str(v) for k, v in attrs.items() if k in rename and v not in (None, "")}


class Profiler:
    """A running pyroscope-io agent; `phase_changed` retags the calling thread."""

    def __init__(self, settings: ProfileSettings):
        import pyroscope  # optional extra `profile`

        self._pyroscope = pyroscope
        self.settings = settings
        ok = pyroscope.configure(
            application_name=settings.app_name,
            server_address=settings.server,
            sample_rate=settings.sample_rate,
            oncpu=not settings.wall,
            gil_only=not settings.all_threads,
            tags=settings.tags,
            report_thread_id=True,      # sample label thread_id: the thread's pthread id
            report_thread_name=True,    # sample label thread_name: its name in `threading`, when it has one
            upload_interval=settings.upload_interval_s,
            http_headers={RECORD_KEY_HEADER: settings.key} if settings.key else None,
            enable_logging=False,
        )
        if ok is False:
            raise RuntimeError("pyroscope.configure() refused to start")
        self.running = True
        self.native_names = NativeThreadNames()
        self.native_names.refresh()

    def phase_changed(self, old: str | None, new: str | None) -> None:
        if not self.running:
            return
        self.native_names.refresh_every()
        if old is not None:
            self._pyroscope.remove_thread_tag(PHASE_TAG, old)
        if new is not None:
            self._pyroscope.add_thread_tag(PHASE_TAG, new)

    def shutdown(self, timeout_s: float = 2.0) -> bool:
        """Stop sampling and push what is left, waiting at most `timeout_s`.

        pyroscope-io returns at once when the server is down, but waits ~30 s for a
        server that accepts and never answers: the final push is then given up.
        Returns True when the agent shut down in time.
        """
        if not self.running:
            return True
        self.running = False
        self.native_names.clear()
        done = threading.Event()

        def stop():
            self._pyroscope.shutdown()
            done.set()

        threading.Thread(target=stop, name="otelgpu-pyroscope-shutdown", daemon=True).start()
        if not done.wait(timeout_s):
            log.warning("otel-gpu: Pyroscope did not answer within %.1f s; last profile dropped", timeout_s)
            return False
        return True


class NativeThread(getattr(threading, "_DummyThread", threading.Thread)):  # type: ignore[misc]
    """A thread started outside `threading` (PyTorch's autograd threads, ...), entered in
    `threading._active` under its OS name so that the sampler (py-spy reads names there) labels
    its samples. Python does the same, named "Dummy-N", when such a thread calls `threading`."""

    def __init__(self, ident: int, name: str):  # noqa: D107 - _DummyThread.__init__ would take the caller's id
        threading.Thread.__init__(self, name=name, daemon=True)
        self._started.set()
        self._ident = ident

    def join(self, timeout: float | None = None) -> None:
        """Returns at once: the thread is not Python's to join (a user's loop that joins every thread
        of `threading.enumerate()` must not fail on it, as it would on a plain dummy thread)."""
        return None


class NativeThreadNames:
    """Names, for the profile, the threads that hold a Python thread state but run no Python frame.

    Found as the thread ids `sys._current_exceptions()` knows (every thread state) and
    `sys._current_frames()` does not (those running Python); named by `pthread_getname_np` when
    the OS name differs from the process's (else left unnamed: the report says so). Checked at
    start and then at most every `every_s` seconds from the phase hooks (no thread of its own).
    """

    def __init__(self, every_s: float = 2.0):
        self.every_s = every_s
        self._next = 0.0
        self._getname = _pthread_getname()
        self.named: dict[int, str] = {}

    def refresh_every(self) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.every_s
            self.refresh()

    def refresh(self) -> None:
        try:
            self._refresh()
        except Exception as exc:  # naming is cosmetic: any failure stops it, never the phase hooks that call this
            log.warning("otel-gpu: native threads left unnamed in profiles: %r", exc)
            self._getname = None

    def _refresh(self) -> None:
        current = getattr(sys, "_current_exceptions", None)
        if current is None or self._getname is None:
            return
        states = set(current())
        running_python = set(sys._current_frames())
        process_name = self._getname(threading.main_thread().ident)
        active = threading._active  # type: ignore[attr-defined]
        with threading._active_limbo_lock:  # type: ignore[attr-defined]
            for ident in list(self.named):          # threads gone (or taken over by `threading`): forgotten
                ours = isinstance(active.get(ident), NativeThread)
                if ident not in states or not ours:
                    if ours:
                        del active[ident]
                    del self.named[ident]
            for ident in states - running_python - set(active) - set(self.named):
                name = self._getname(ident)
                if name and name != process_name:
                    active[ident] = NativeThread(ident, name)
                    self.named[ident] = name

    def clear(self) -> None:
        """Take every entry this made out of `threading`'s table."""
        active = threading._active  # type: ignore[attr-defined]
        with threading._active_limbo_lock:  # type: ignore[attr-defined]
            for ident in self.named:
                if isinstance(active.get(ident), NativeThread):
                    del active[ident]
            self.named.clear()


def _pthread_getname():
    """`pthread_getname_np` as ident -> OS thread name (None: unreadable), or None without one."""
    import ctypes   # here: the trace commands import this module for its names only

    try:
        # PyDLL keeps the GIL during the call, so the thread cannot delete its thread state (and exit)
        # between being listed and being named
        fn = ctypes.PyDLL(None).pthread_getname_np
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_ulong, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int

    def name(ident: int | None) -> str | None:
        buf = ctypes.create_string_buffer(16)
        if ident is None or fn(ident, buf, len(buf)) != 0:
            return None
        return buf.value.decode("utf-8", "replace") or None

    return name


def start(settings: ProfileSettings | None) -> Profiler | None:
    """Start profiling, or return None (with one log line) when pyroscope-io is missing or refuses."""
    if settings is None:
        return None
    try:
        return Profiler(settings)
    except ImportError:
        log.warning("otel-gpu: pyroscope-io is not installed (pip install 'otel-gpu[profile]'): no profiling")
    except Exception as exc:  # a profiler that cannot start must not stop the training
        log.warning("otel-gpu: profiling not started: %r", exc)
    return None
