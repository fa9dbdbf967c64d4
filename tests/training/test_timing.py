"""Timer: exclusive phase time, re-entry, step drivers, errors kept away from the caller."""
import pytest

from otel_gpu.training.timing import Timer


class ListSink:
    def __init__(self):
        self.steps, self.phases, self.checkpoints = [], [], []

    def step(self, seconds, samples, tokens):
        self.steps.append((round(seconds, 6), samples, tokens))

    def phase(self, name, seconds):
        self.phases.append((name, round(seconds, 6)))

    def checkpoint(self, event):
        self.checkpoints.append(event)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t

    def tick(self, s):
        self.t += s


class Tags:
    def __init__(self):
        self.changes = []

    def phase_changed(self, old, new):
        self.changes.append((old, new))


@pytest.fixture
def parts():
    sink, clock, tags = ListSink(), Clock(), Tags()
    return Timer(sink, tags, clock), sink, clock, tags


def test_nested_phases_count_exclusive_time_and_retag(parts):
    t, sink, clock, tags = parts
    with t.step(samples=4, tokens=64):
        with t.phase("optimizer"):
            clock.tick(1.0)
            with t.phase("checkpoint"):
                clock.tick(3.0)
            clock.tick(0.5)
        clock.tick(0.25)
    assert sink.phases == [("checkpoint", 3.0), ("optimizer", 1.5)]
    assert sink.steps == [(4.75, 4, 64)]
    assert sink.checkpoints == ["start", "end"]
    assert tags.changes == [(None, "optimizer"), ("optimizer", "checkpoint"), ("checkpoint", "optimizer"), ("optimizer", None)]


def test_reentering_the_same_phase_is_counted_once(parts):
    t, sink, clock, _ = parts
    with t.phase("backward"):           # the HF Trainer's accelerator.backward ...
        clock.tick(1.0)
        with t.phase("backward"):       # ... calls DeepSpeed's engine.backward
            clock.tick(2.0)
        clock.tick(1.0)
    assert sink.phases == [("backward", 4.0)]


def test_higher_driver_takes_over_step_boundaries(parts):
    t, sink, clock, _ = parts
    t.mark_step("optimizer")            # opens step 1
    clock.tick(1.0)
    t.mark_step("optimizer")            # closes it
    assert sink.steps == [(1.0, None, None)]
    t.begin_step("hf")                  # the Trainer callback speaks: it owns steps from now
    clock.tick(2.0)
    t.mark_step("optimizer")            # ignored
    t.end_step("hf", samples=8)
    t.mark_step("deepspeed")            # lower than hf: ignored
    assert sink.steps == [(1.0, None, None), (2.0, 8, None)]
    assert t.driver == "hf"


def test_unbalanced_exit_is_ignored(parts):
    t, sink, clock, _ = parts
    t.exit("forward")
    t.enter("forward")
    t.exit("backward")
    clock.tick(1.0)
    t.exit("forward")
    assert sink.phases == [("forward", 1.0)]


def test_a_failing_sink_turns_the_timer_off_without_raising(parts, caplog):
    t, sink, clock, _ = parts

    def broken(*args):
        raise RuntimeError("backend library bug")

    sink.step = broken
    with t.step():
        clock.tick(1.0)
    assert t.broken
    with t.phase("forward"):            # no-op from now on
        pass
    assert sink.phases == []
    assert "disabled after an internal error" in caplog.text


def test_unwind_closes_what_an_exception_left_open(parts):
    t, sink, clock, tags = parts
    t.enter("forward")
    clock.tick(1.0)
    t.enter("backward")
    clock.tick(2.0)
    t.unwind()
    assert sink.phases == [("backward", 2.0), ("forward", 1.0)]
    assert t.current_phase() is None and tags.changes[-1] == ("forward", None)
