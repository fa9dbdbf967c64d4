"""A rank's trace capture in process: the real Timer and the real torch.profiler (CPU), steps A..B marked
and written whole, requests answered, a capture missed, refused, cut off or failing said once."""
from __future__ import annotations

import gzip
import json
import logging
import re

import pytest

from otel_gpu.trace import capture_files as cf

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

from otel_gpu.training.timing import Timer  # noqa: E402
from tests.training.test_timing import ListSink as Sink  # noqa: E402
from otel_gpu.training import trace_capture  # noqa: E402
from otel_gpu.training.trace_capture import Capture  # noqa: E402


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def install(env, rank, timer):
    """`trace_capture.install`, the capture's exit hook not registered (the test calls it)."""
    return trace_capture.install(env, rank, timer, at_exit=lambda fn: None)


def profiler_on() -> bool:
    return bool(torch._C._autograd._profiler_enabled())


def step_marks(path) -> list[int]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return sorted(int(m.group(1)) for e in doc["traceEvents"]
                  if (m := re.fullmatch(r"ProfilerStep#(\d+)", str(e.get("name", "")))))


def work():
    torch.nn.functional.linear(torch.randn(4, 8), torch.randn(3, 8)).sum()


def train(timer: Timer, marks: int, seen: list | None = None) -> None:
    """`marks` optimizer-style step boundaries (the first opens step 1): marks - 1 steps closed."""
    for _ in range(marks):
        work()
        timer.mark_step("optimizer")
        if seen is not None:
            seen.append(profiler_on())


def test_steps_a_to_b_only_are_profiled_and_written_whole(tmp_path):
    timer = Timer(Sink())
    capture = install({cf.TRACE_STEPS: "3-4", cf.TRACE_DIR: str(tmp_path)}, "0", timer)
    assert capture is not None and timer.step_listener is capture
    seen: list[bool] = []
    train(timer, 5, seen)   # step 4 closes: the profiler stops, the trace is gzip'd on another thread
    assert capture.state in (cf.WRITING, cf.WRITTEN) and capture.flush(30)
    train(timer, 3, seen)
    # after the mark that opens step k, the profiler is on iff k is in 3..4 (step k opens at mark k)
    assert seen == [False, False, True, True, False, False, False, False]
    trace = tmp_path / "steps-3-4" / "rank0.pt.trace.json.gz"
    assert step_marks(trace) == [3, 4]
    assert [p.name for p in (tmp_path / "steps-3-4").iterdir()] == [trace.name]   # no temporary file left
    status = cf.read_statuses(tmp_path)[0]   # written as the trace was
    assert status["state"] == cf.WRITTEN and status["window"] == [3, 4] and status["step"] == 4
    assert len(status["captured_step_s"]) == 2
    parts = status["stop_parts_s"]   # stop and export on this thread (stop_s), the write on the writer's
    assert parts["write"] > 0 and status["stop_s"] == pytest.approx(parts["stop"] + parts["export"])
    capture.at_exit()   # the final count
    status = cf.read_statuses(tmp_path)[0]
    assert status["state"] == cf.WRITTEN and status["step"] == 7
    assert status["unprofiled_steps"] == 7 - 2 - 1   # the step after the capture paid its stop and write


def test_user_driver_steps_are_marked_from_begin_to_end(tmp_path):
    timer = Timer(Sink())
    capture = install({cf.TRACE_STEPS: "2-2", cf.TRACE_DIR: str(tmp_path)}, "1", timer)
    for _ in range(3):
        with timer.step():
            work()
    assert capture.flush(30)
    assert step_marks(tmp_path / "steps-2-2" / "rank1.pt.trace.json.gz") == [2]
    assert not profiler_on()


def _request(root, text: str, clock: Clock):
    cf.write_whole(root / cf.REQUEST, text)
    clock.t += 2.0   # past the once-a-second check


def test_requests_poll_capture_missed_and_busy(tmp_path):
    clock = Clock()
    timer = Timer(Sink())
    capture = Capture(tmp_path, "0", watch=True, clock=clock)
    (tmp_path / cf.RANKS).mkdir()
    timer.step_listener = capture
    train(timer, 4)
    _request(tmp_path, cf.request_text("aa", "poll"), clock)
    train(timer, 1)
    assert cf.read_statuses(tmp_path)[0]["answered"] == "aa" and cf.read_statuses(tmp_path)[0]["step"] == 4
    _request(tmp_path, cf.request_text("bb", "capture", 2, 3), clock)   # already past step 2
    train(timer, 1)
    status = cf.read_statuses(tmp_path)[0]
    assert (status["request"], status["state"]) == ("bb", cf.MISSED) and "already at step 5" in status["message"]
    _request(tmp_path, cf.request_text("cc", "capture", 9, 10), clock)
    train(timer, 1)
    assert cf.read_statuses(tmp_path)[0]["state"] == cf.ARMED
    _request(tmp_path, cf.request_text("dd", "capture", 20, 21), clock)   # while armed: refused, the first kept
    train(timer, 1)
    status = cf.read_statuses(tmp_path)[0]
    assert (status["request"], status["state"]) == ("dd", cf.FAILED) and "busy with steps 9-10" in status["message"]
    train(timer, 5)
    assert capture.flush(30)
    status = cf.read_statuses(tmp_path)[0]
    assert (status["request"], status["state"]) == ("cc", cf.WRITTEN)
    assert step_marks(tmp_path / "steps-9-10" / "rank0.pt.trace.json.gz") == [9, 10]
    assert not (tmp_path / "steps-20-21").exists()


def test_a_job_that_ends_before_step_a_says_so(tmp_path, caplog):
    timer = Timer(Sink())
    capture = install({cf.TRACE_STEPS: "50-60", cf.TRACE_DIR: str(tmp_path)}, "0", timer)
    train(timer, 4)
    with caplog.at_level(logging.WARNING, "otel_gpu.training"):
        capture.at_exit()
    status = cf.read_statuses(tmp_path)[0]
    assert status["state"] == cf.ENDED and "ended at step 3" in status["message"]
    assert "not captured" in caplog.text and not (tmp_path / "steps-50-60").exists()


def test_a_job_that_ends_inside_the_capture_leaves_no_file(tmp_path):
    timer = Timer(Sink())
    capture = install({cf.TRACE_STEPS: "2-9", cf.TRACE_DIR: str(tmp_path)}, "0", timer)
    train(timer, 4)
    assert profiler_on()
    capture.at_exit()
    assert not profiler_on() and not (tmp_path / "steps-2-9").exists()
    assert "ended inside the capture" in cf.read_statuses(tmp_path)[0]["message"]


def test_a_profiler_that_cannot_start_is_one_line_and_training_goes_on(tmp_path, caplog):
    timer = Timer(Sink())
    install({cf.TRACE_STEPS: "2-3", cf.TRACE_DIR: str(tmp_path)}, "0", timer)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):   # the job's own profiler
        with caplog.at_level(logging.WARNING, "otel_gpu.training"):
            train(timer, 5)
    assert not timer.broken and len(timer.sink.steps) == 4
    lines = [r for r in caplog.records if "abandoned" in r.getMessage()]
    assert len(lines) == 1 and "already running" in lines[0].getMessage()
    assert cf.read_statuses(tmp_path)[0]["state"] == cf.FAILED and not (tmp_path / "steps-2-3").exists()


def test_nothing_installed_without_the_variables(tmp_path):
    timer = Timer(Sink())
    assert install({}, "0", timer) is None and timer.step_listener is None


@pytest.mark.parametrize("raw, stacks", [(None, cf.DEFAULT_STACKS), ("1", True), ("0", False)])
def test_stacks_on_hook_every_python_thread_and_off_hook_none(tmp_path, raw, stacks):
    """$OTELGPU_TRACE_STACKS: with stacks, torch's Python tracer sets a profile function on every Python
    thread for the captured steps (the reason to be able to turn it off); without, on none."""
    import sys
    import threading
    env = {cf.TRACE_STEPS: "2-2", cf.TRACE_DIR: str(tmp_path)} | ({cf.TRACE_STACKS: raw} if raw else {})
    timer = Timer(Sink())
    capture = install(env, "0", timer)
    asked, seen, done = threading.Event(), [], threading.Event()

    def other():
        asked.wait(10)
        seen.append(sys.getprofile() is not None)
        done.set()

    helper = threading.Thread(target=other)
    helper.start()
    train(timer, 2)   # step 2 opens: the profiler is on
    seen.append(sys.getprofile() is not None)
    asked.set()
    done.wait(10)
    train(timer, 1)
    helper.join()
    assert capture.flush(30) and profiler_on() is False and seen == [stacks, stacks]
    status = cf.read_statuses(tmp_path)[0]
    assert status["state"] == cf.WRITTEN and status["stacks"] is stacks
    with gzip.open(tmp_path / "steps-2-2" / "rank0.pt.trace.json.gz", "rt") as f:
        cats = {e.get("cat") for e in json.load(f)["traceEvents"]}
    assert ("python_function" in cats) is stacks


def test_a_boundary_on_another_thread_never_touches_the_profiler(tmp_path):
    """Steps closed on another thread are counted, but the profiler is stopped (and marked) only on the
    thread that started it, at its next boundary."""
    import threading
    timer = Timer(Sink())
    capture = install({cf.TRACE_STEPS: "2-2", cf.TRACE_DIR: str(tmp_path)}, "0", timer)
    train(timer, 2)   # step 2 opened on this thread
    elsewhere = threading.Thread(target=timer.mark_step, args=("optimizer",))   # closes step 2 over there
    elsewhere.start()
    elsewhere.join()
    assert profiler_on() and capture.state == cf.CAPTURING and capture.closed == 2
    train(timer, 1)   # the next boundary here stops it and writes step 2
    assert capture.flush(30) and not profiler_on() and cf.read_statuses(tmp_path)[0]["state"] == cf.WRITTEN
    assert step_marks(tmp_path / "steps-2-2" / "rank0.pt.trace.json.gz") == [2]


def test_the_process_exit_waits_for_the_trace_being_written(tmp_path):
    timer = Timer(Sink())
    capture = install({cf.TRACE_STEPS: "2-2", cf.TRACE_DIR: str(tmp_path)}, "0", timer)
    train(timer, 3)   # step 2 closed: its trace goes to the writer
    capture.at_exit()
    assert cf.read_statuses(tmp_path)[0]["state"] == cf.WRITTEN
    assert step_marks(tmp_path / "steps-2-2" / "rank0.pt.trace.json.gz") == [2]
