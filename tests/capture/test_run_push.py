"""`otel-gpu run` with a Pyroscope server: each analysed capture's GPU time pushed at the end, labelled as
the ranks' CPU profiles (a real rank's pyroscope-io push beside it, through the recording's receiver),
over its captured steps' window; a server down or hanging is one line, the run's status unchanged. The
captured trace is the crafted GPU fixture of tests/trace/test_gpu_flame.py, put in place by the command."""
from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.cli import main
from otel_gpu.record.decode import decompress, push_profiles
from otel_gpu.run_cli import _traces_at_end
from otel_gpu.trace import capture_files as cf
from otel_gpu.trace.run_push import Target, identity, push_captures, target, window
from otel_gpu.trace.run_traces import finish_run
from pyroscope_receiver import Receiver
from tests.childenv import LEAKY
from tests.trace.test_gpu_flame import EXPECTED, crafted

HERE = Path(__file__).resolve().parent
DEAD = "http://127.0.0.1:9"   # nothing listens there


def _clean(monkeypatch) -> None:
    for k in list(os.environ):
        if k.startswith(LEAKY):
            monkeypatch.delenv(k)


def _err_lines(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


def test_a_recorded_run_pushes_the_gpu_time_beside_the_ranks_cpu_profiles(tmp_path, monkeypatch, capfd):
    _clean(monkeypatch)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "otelgpu.job=from-attrs")   # the ranks' job, over --job
    crafted(str(tmp_path / "gpu.json"))
    with Receiver() as rx:
        t0 = time.time()
        rc = main(["run", "--record", str(tmp_path / "run"), "--no-agent", "--no-report", "--no-live", "--job", "j1",
                   "--trace-steps", "3-3", "--pyroscope", rx.url, "--",
                   sys.executable, str(HERE / "push_rank.py"), str(tmp_path / "gpu.json")])
        t1 = time.time()
    assert rc == 0
    cpu = [p for p in rx.profiles if p.series["__name__"] != "gpu_time"]
    gpu = [p for p in rx.profiles if p.series["__name__"] == "gpu_time"]
    assert cpu and len(gpu) == 1, [p.series for p in rx.profiles]   # the rank's own push came through
    labels = gpu[0].series
    assert labels == {"__name__": "gpu_time", "service_name": "otelgpu.from-attrs", "rank": "0", "job": "from-attrs"}
    assert {(p.series["service_name"], p.series["job"], p.series["rank"]) for p in cpu} == \
        {(labels["service_name"], labels["job"], labels["rank"])}
    assert gpu[0].sample_types == [("gpu_time", "nanoseconds")]
    assert {tuple(reversed(s.stack)): s.value for s in gpu[0].samples} == EXPECTED
    (rows,) = [r for body in rx.bodies for r in push_profiles(decompress(body, "gzip")) if r.sample_type == "gpu_time"]
    assert sum(v for _, _, v in rows.samples) == sum(EXPECTED.values())
    # the window: the captured step (2.0 ms in the trace: no status for it, as the command copied it in)
    assert t0 <= rows.t0 < rows.t1 <= t1 and abs((rows.t1 - rows.t0) - 0.002) < 1e-6
    err = capfd.readouterr().err
    assert "trace of steps 900-900: GPU time by launching code pushed to Pyroscope at " in err
    assert (tmp_path / "run" / "traces" / "analysis" / "steps-900-900.gpu_time.json").is_file()


def test_a_run_not_recorded_keeps_its_status_when_pyroscope_is_down(tmp_path, monkeypatch, capfd):
    _clean(monkeypatch)
    monkeypatch.setenv("OTELGPU_PYROSCOPE_URL", DEAD)   # the variable, as the flag
    monkeypatch.setenv(cf.TRACE_DIR, str(tmp_path / "traces"))
    crafted(str(tmp_path / "gpu.json"))
    cmd = (f'mkdir -p "$OTELGPU_TRACE_DIR/steps-3-3" && cp {shlex.quote(str(tmp_path / "gpu.json"))} "$OTELGPU_TRACE_DIR/steps-3-3/"; '
           'exit 3')
    assert main(["run", "--no-record", "--trace-steps", "3-3", "--", "sh", "-c", cmd]) == 3
    said = [line for line in _err_lines(capfd) if "Pyroscope" in line]
    assert len(said) == 2 and "is not reachable" in said[0]   # said at the start, and once at the end:
    assert said[1].startswith(f"otel-gpu run: trace of steps 3-3: GPU time not pushed to Pyroscope: {DEAD}/")
    assert "--service-name otelgpu.train" in said[1]
    assert (tmp_path / "traces" / "analysis" / "steps-3-3.gpu_time.json").is_file()   # the results stay


def _two_captures(root: Path) -> dict:
    for name in ("steps-3-3", "steps-7-7"):
        (root / name).mkdir(parents=True)
        crafted(str(root / name / "rank0.pt.trace.json"))
    summary, _ = finish_run(root, None)
    return summary


def test_a_hanging_server_costs_the_deadline_once_and_the_rest_is_not_tried(tmp_path):
    summary = _two_captures(tmp_path)
    with Receiver(mode="hang") as rx:
        t = time.monotonic()
        (tmp_path / "sub").mkdir()   # the folder as a user may name it
        lines = push_captures(tmp_path / "sub" / "..", summary, Target(rx.url, "s", None), timeout_s=0.5)
        took = time.monotonic() - t
    assert took < 3 and rx.requests == 1
    assert len(lines) == 1 and "no answer within" in lines[0] and "1 later capture not tried" in lines[0]


def test_each_capture_is_pushed_over_the_ranks_own_window(tmp_path):
    import json

    summary = _two_captures(tmp_path)
    (tmp_path / cf.RANKS).mkdir()
    status = {"rank": "0", "pid": 1, "start_ticks": 1, "time": 5.0, "step": 9, "state": cf.WRITTEN, "window": [7, 7],
              "captured_step_s": [0.25], "stop_parts_s": {"stop": 0.5, "export": 1.0, "write": 0.25}}
    (tmp_path / cf.RANKS / "rank0-pid1.json").write_text(json.dumps(status))
    trace = tmp_path / "steps-7-7" / "rank0.pt.trace.json"
    os.utime(trace, (1_700_000_010, 1_700_000_010))
    with Receiver() as rx:
        lines = push_captures(tmp_path, summary, Target(rx.url, "svc", "j"))
    assert [line.split(":")[0] for line in lines] == ["trace of steps 3-3", "trace of steps 7-7"]
    assert all("pushed to Pyroscope" in line for line in lines)
    (_, rows), = [(b, r) for b in rx.bodies[1:] for r in push_profiles(decompress(b, "gzip"))]
    assert (rows.t0, rows.t1) == (1_700_000_008.0, 1_700_000_008.25)   # 10 s less 1.75 s of stop, export, write
    assert rows.labels == {"__name__": "gpu_time", "service_name": "svc", "rank": "0", "job": "j"}


def test_profiles_off_is_said_once_and_nothing_is_pushed(tmp_path, capsys):
    root = tmp_path / "traces"
    _two_captures(root)
    assert target(DEAD, True, {}) == (None, "profiles are off (--no-profile)")
    assert target(DEAD, False, {"OTELGPU_PROFILE": "0"}) == (None, "profiles are off (OTELGPU_PROFILE)")
    assert target(None, False, {}) == (None, None)
    _traces_at_end(root, None, *target(DEAD, True, {}))
    err = capsys.readouterr().err
    assert err.count("Pyroscope") == 1
    assert "GPU time was not pushed to Pyroscope: profiles are off (--no-profile)" in err


def test_the_service_name_and_job_are_the_ranks():
    assert identity({}) == ("otelgpu.train", None)
    assert identity({"OTELGPU_JOB": "a", "SLURM_JOB_NAME": "b"}) == ("otelgpu.a", "a")
    assert identity({"TORCHELASTIC_RUN_ID": "r", "OTEL_RESOURCE_ATTRIBUTES": "x=1,otelgpu.job=c%20d"}) == \
        ("otelgpu.c d", "c d")
    assert identity({"OTELGPU_JOB": "a", "OTEL_SERVICE_NAME": "svc"}) == ("svc", "a")
    t, why = target("http://p:4040", False, {"OTELGPU_JOB": "a"})
    assert why is None and t == Target("http://p:4040", "otelgpu.a", "a")


def test_the_window_ends_at_step_e_and_spans_the_captured_steps():
    status = {"stop_parts_s": {"stop": 0.5, "export": 0.25, "write": None}, "captured_step_s": [1.0, 2.0]}
    assert window(100.0, (5, 6), status, 9.0) == (96_250_000_000, 3_000_000_000)
    assert window(100.0, (5, 6), None, 1.5) == (97_000_000_000, 3_000_000_000)
    assert window(100.0, (5, 6), {"captured_step_s": [1.0]}, None) == (100_000_000_000, 0)   # a partial list


@settings(max_examples=50, deadline=None)
@given(written=st.floats(0, 4e9), steps=st.tuples(st.integers(1, 10**9), st.integers(0, 500)),
       parts=st.dictionaries(st.sampled_from(["stop", "export", "write"]),
                             st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=2))),
       captured=st.one_of(st.none(), st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-5, 5)), max_size=4)),
       median=st.one_of(st.none(), st.floats(allow_nan=True)))
def test_a_window_is_never_negative_and_never_past_the_files_time(written, steps, parts, captured, median):
    a, b = steps[0], steps[0] + steps[1]
    start, length = window(written, (a, b), {"stop_parts_s": parts, "captured_step_s": captured}, median)
    assert length >= 0 and start + length <= round(written * 1e9) + 1
