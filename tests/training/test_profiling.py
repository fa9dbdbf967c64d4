"""The real pyroscope-io agent in a training process, pushing to a receiver that decodes pprof."""
import pytest

from conftest import HERE, clean_env, run_py
from pyroscope_receiver import Receiver

from otel_gpu import profiling
from otel_gpu.errors import ConfigError

pytestmark = pytest.mark.slow


def _phase(name):
    return lambda s: s.labels.get("phase") == name


def test_flame_graph_shows_compute_and_wait_tagged_by_rank_and_phase():
    with Receiver() as rx:
        env = clean_env(OTELGPU_PYROSCOPE_URL=rx.url, RANK="3", WORLD_SIZE="4", OTELGPU_JOB="profjob")
        proc = run_py([str(HERE / "prof_workload.py"), "6", "0.5"], env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert rx.profiles, "nothing pushed"
    series = rx.profiles[0].series
    assert (series["rank"], series["job"], series["world_size"]) == ("3", "profjob", "4")
    assert series["service_name"] == "otelgpu.profjob"
    assert rx.profiles[0].period == 20_000_000          # 50 Hz

    fwd, bwd = rx.weight(_phase("forward")), rx.weight(_phase("backward"))
    # the function made slow on purpose, under the forward tag: about 6 x 0.25 s
    assert 0.8e9 <= fwd.get("slow_compute", 0) <= 2.5e9
    # the function blocked on a lock (no CPU used) shows its wait, under the backward tag
    assert 0.8e9 <= bwd.get("blocked_on_lock", 0) <= 2.5e9
    # and each is only under its own phase
    assert "blocked_on_lock" not in fwd and "slow_compute" not in bwd
    # every sample names its thread (the report tells otel-gpu's threads apart by name; the
    # exporter's, absent here without an OTLP endpoint, is checked in tests/record/test_report_flame_threads.py)
    from otel_gpu.profile_threads import is_own

    samples = [s for p in rx.profiles for s in p.samples]
    assert all(s.labels.get("thread_id", "").isdigit() for s in samples)
    assert {s.labels.get("thread_name") for s in samples if "slow_compute" in s.stack} == {"MainThread"}
    assert not any(is_own(list(s.stack), s.labels) for s in samples if s.labels.get("phase"))


def test_settings_from_environment():
    assert profiling.profile_settings({}, "a", {}) is None
    assert profiling.profile_settings({"OTELGPU_PYROSCOPE_URL": "http://p:4040", "OTELGPU_PROFILE": "0"}, "a", {}) is None
    s = profiling.profile_settings({"OTELGPU_PYROSCOPE_URL": "http://p:4040/", "OTELGPU_PROFILE_MODE": "cpu",
                                    "OTELGPU_PROFILE_RATE": "50"}, "app", {"rank": "1"})
    assert (s.server, s.wall, s.all_threads, s.sample_rate, s.tags) == ("http://p:4040", False, True, 50, {"rank": "1"})
    for bad in ({"OTELGPU_PROFILE_MODE": "both"}, {"OTELGPU_PROFILE_RATE": "fast"}, {"OTELGPU_PROFILE_THREADS": "x"}):
        with pytest.raises(ConfigError):
            profiling.profile_settings({"OTELGPU_PYROSCOPE_URL": "http://p:4040", **bad}, "a", {})
    with pytest.raises(ConfigError):
        profiling.profile_settings({"OTELGPU_PYROSCOPE_URL": "p:4040"}, "a", {})


def test_pyroscope_label_names():
    attrs = {"host.name": "n1", "otelgpu.job": "j", "otelgpu.rank": "2", "otelgpu.local_rank": "0", "other": "x"}
    assert profiling.pyroscope_tags(attrs) == {"node": "n1", "job": "j", "rank": "2", "local_rank": "0"}


def test_receiver_decodes_the_captured_push():
    """The decoder against a request captured from pyroscope-io 1.4.0 (figures from its text view)."""
    from pathlib import Path

    from pyroscope_receiver import parse_push

    body = Path(__file__).parents[1] / "data" / "pyroscope" / "push_request_cpu.bin"   # see PROVENANCE.txt
    (p,) = parse_push(body.read_bytes())
    assert p.series["rank"] == "0" and p.series["service_name"] == "scout.cpu.test"
    assert p.sample_types == [("cpu", "nanoseconds")]
    assert sum(s.value for s in p.samples) == 8_200_000_000
    assert sum(s.value for s in p.samples if s.labels.get("phase") == "tagged") == 3_100_000_000
    leaf = {}
    for s in p.samples:
        leaf[s.stack[0]] = leaf.get(s.stack[0], 0) + s.value
    assert leaf == {"hashing": 5_770_000_000, "fib": 2_420_000_000, "busy": 10_000_000}


def _native_thread(name: bytes | None):
    """A thread that holds a Python thread state and runs no Python frame (blocked in a C function),
    named `name` by the OS; returns (its id, the queue that ends it)."""
    import _thread
    import ctypes
    import queue

    q = queue.SimpleQueue()
    ident = _thread.start_new_thread(q.get, ())
    if name:
        assert ctypes.CDLL(None).pthread_setname_np(ctypes.c_ulong(ident), name) == 0
    return ident, q


def _wait(cond, timeout=5.0):
    import time

    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()


def test_native_threads_are_named_for_the_sampler_and_forgotten_when_gone():
    import os
    import sys
    import threading

    if not hasattr(sys, "_current_exceptions"):
        pytest.skip("sys._current_exceptions() (Python 3.11+?) is needed to see frame-less threads")
    named, q1 = _native_thread(b"pt_autograd_0")
    unnamed, q2 = _native_thread(None)
    names = profiling.NativeThreadNames()
    assert _wait(lambda: names.refresh() or named in names.named)
    assert names.named == {named: "pt_autograd_0"}           # the one the OS names like the process is left unnamed
    entry = {t.ident: t for t in threading.enumerate()}[named]
    assert (entry.name, entry.is_alive(), entry.daemon) == ("pt_autograd_0", True, True)
    pid = os.fork()                                           # `threading` still works in a forked child
    if pid == 0:
        os._exit(0 if [t.name for t in threading.enumerate()] == ["MainThread"] else 3)
    assert os.waitpid(pid, 0)[1] == 0
    q1.put(None)
    q2.put(None)
    assert _wait(lambda: names.refresh() or not names.named)
    assert named not in {t.ident for t in threading.enumerate()}
