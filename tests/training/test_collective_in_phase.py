"""A collective inside a phase is collective wait, not that phase's own time, wherever it happens: inside
a step, between steps (a framework's batch fetch that all-gathers token counts), nested phases, async
calls waited in another phase, and while the exporter reads open phases."""
import threading

import pytest

from otel_gpu.training.timing import Timer


class Sink:
    def __init__(self):
        self.phases, self.collectives, self.steps = [], [], []

    def step(self, seconds, samples, tokens):
        self.steps.append(round(seconds, 6))

    def phase(self, name, seconds):
        self.phases.append((name, round(seconds, 6)))

    def checkpoint(self, event):
        pass

    def collective(self, kind, phase, seconds):
        self.collectives.append((kind, phase, round(seconds, 6)))


class Clock:
    def __init__(self):
        self.t = 50.0

    def __call__(self):
        return self.t

    def tick(self, s):
        self.t += s


@pytest.fixture
def parts():
    sink, clock = Sink(), Clock()
    return Timer(sink, None, clock), sink, clock


def blocked(t: Timer, clock: Clock, kind: str, seconds: float) -> None:
    """What the collective wrappers do around a call that blocks `seconds`."""
    began = t.wait_begin()
    clock.tick(seconds)
    t.wait_end(kind, began)


def test_a_wait_between_steps_inside_a_phase_is_collective_wait(parts):
    """The HF Trainer fetches the batch (and all-gathers its token count) before the step begins."""
    t, sink, clock = parts
    t.claim("hf")
    with t.phase("data_wait"):
        clock.tick(0.01)                        # the batch
        blocked(t, clock, "all_gather", 0.2)    # the other rank is saving a checkpoint
        clock.tick(0.002)
    with t.step():
        with t.phase("forward"):
            clock.tick(0.1)
    assert sink.phases == [("data_wait", 0.012), ("forward", 0.1)]
    assert sink.collectives == [("all_gather", "data_wait", 0.2)]


def test_a_wait_in_logging_inside_a_step_leaves_the_phase_its_own_time(parts):
    t, sink, clock = parts
    with t.step():
        with t.phase("optimizer"):
            clock.tick(0.05)
        with t.phase("logging"):                # the user's own phase around a metric all-reduce
            clock.tick(0.003)
            blocked(t, clock, "all_reduce", 0.12)
        blocked(t, clock, "barrier", 0.01)      # outside every phase, inside the step
    assert sink.phases == [("optimizer", 0.05), ("logging", 0.003)]
    assert sink.collectives == [("all_reduce", "logging", 0.12), ("barrier", "", 0.01)]
    assert sink.steps == [0.183]                # the step itself still lasts as long as it did


def test_a_wait_outside_phases_and_steps_is_nobodys(parts):
    t, sink, clock = parts
    blocked(t, clock, "barrier", 2.0)          # set-up before training
    assert sink.collectives == []


def test_nested_phase_loses_only_what_it_waited(parts):
    t, sink, clock = parts
    with t.phase("optimizer"):
        clock.tick(1.0)
        with t.phase("checkpoint"):
            clock.tick(0.5)
            blocked(t, clock, "barrier", 3.0)   # a save that waits for the other ranks
            clock.tick(0.25)
        clock.tick(1.0)
    assert sink.phases == [("checkpoint", 0.75), ("optimizer", 2.0)]
    assert sink.collectives == [("barrier", "checkpoint", 3.0)]


def test_async_call_and_wait_each_pause_their_own_phase(parts):
    t, sink, clock = parts
    with t.step():
        with t.phase("forward"):
            clock.tick(0.1)
            began = t.wait_begin()
            clock.tick(0.02)                    # the call of an async_op=True all-gather
            took = t.wait_end(None, began)
            clock.tick(0.1)
        with t.phase("backward"):
            clock.tick(0.2)
            began = t.wait_begin()
            clock.tick(0.5)                     # its Work.wait()
            t.wait_end("all_gather", began, took)
    assert took == pytest.approx(0.02)
    assert sink.phases == [("forward", 0.2), ("backward", 0.2)]
    assert sink.collectives == [("all_gather", "backward", 0.52)]


def test_a_wait_inside_eval_comes_out_of_the_phase(parts):
    """`otel_gpu.training.collective()` around a wait of the caller's own library (wait_begin / wait_end)."""
    t, sink, clock = parts
    with t.step():
        with t.phase("eval"):
            clock.tick(1.0)
            blocked(t, clock, "all_reduce", 0.4)
            clock.tick(0.1)
    assert sink.phases == [("eval", 1.1)]
    assert sink.collectives == [("all_reduce", "eval", 0.4)]
    assert sink.steps == [0.0]                  # the evaluation and its wait: neither is step time


def test_a_phase_entered_during_a_wait_counts_nothing_until_the_wait_ends(parts):
    """A phase opened inside a wait (the body of `otg.collective(...)` calling the model) is paused with it."""
    t, sink, clock = parts
    with t.phase("forward"):
        clock.tick(1.0)
        began = t.wait_begin()
        clock.tick(0.2)
        with t.phase("inner"):
            clock.tick(0.1)
        clock.tick(0.2)
        t.wait_end("broadcast", began)
    assert sink.phases == [("inner", 0.0), ("forward", 1.0)]
    assert sink.collectives == [("broadcast", "forward", 0.5)]


def test_a_wait_across_a_phase_change_resumes_the_phase_it_paused(parts):
    """A entered at 0, a wait from 1 to 3, B entered at 2 (inside the wait) and left at 4, A left at 5: the
    wait is A's (it began there), B counts 3..4 only, A counts 0..1 and 4..5; nothing stays paused."""
    t, sink, clock = parts
    t.enter("A")
    clock.tick(1.0)
    began = t.wait_begin()
    clock.tick(1.0)
    t.enter("B")
    clock.tick(1.0)
    t.wait_end("all_reduce", began)
    clock.tick(1.0)
    t.exit("B")
    clock.tick(1.0)
    t.exit("A")
    assert sink.phases == [("B", 1.0), ("A", 2.0)]
    assert sink.collectives == [("all_reduce", "A", 2.0)]   # 2.0 + 1.0 + 2.0 = the 5 s of wall time
    with t.phase("C"):                          # and the thread counts again afterwards
        clock.tick(0.5)
    assert sink.phases[-1] == ("C", 0.5)


def test_a_wait_begun_outside_phases_that_opens_eval_stays_the_steps(parts):
    """wait_begin on an empty stack, then the model called under no_grad inside the wait opens eval: the wait
    is the step's (it began outside every phase), eval counts from the wait's end, and eval leaves the step
    with its own seconds only, so step time minus the wait is what lies outside both."""
    t, sink, clock = parts
    t.begin_step("user")
    began = t.wait_begin()
    clock.tick(1.0)
    t.enter("eval")                             # inside the wait
    clock.tick(1.0)
    t.wait_end("all_reduce", began)
    clock.tick(1.0)                             # eval's own second
    t.exit("eval")
    clock.tick(1.0)                             # outside every phase
    t.end_step("user")
    assert sink.phases == [("eval", 1.0)]
    assert sink.collectives == [("all_reduce", "", 2.0)]
    assert sink.steps == [3.0]                  # 4 s of wall time less eval's own second
    assert sink.steps[0] - 2.0 == pytest.approx(1.0)


def test_a_wait_whose_phase_ended_meanwhile_goes_to_the_phase_it_ends_in(parts):
    """The phase the wait began in was left during the wait (an exception unwound it): the wait is counted
    under the innermost phase at its end (outside every phase: the step's) and no phase stays paused."""
    t, sink, clock = parts
    with t.step():
        with t.phase("optimizer"):
            t.enter("logging")
            clock.tick(0.1)
            began = t.wait_begin()
            clock.tick(0.3)
            t.exit("logging")
            clock.tick(0.2)
            t.wait_end("barrier", began)
            clock.tick(0.4)
        began = t.wait_begin()
        with t.phase("checkpoint"):
            clock.tick(0.5)
        t.wait_end("all_gather", began)
        clock.tick(0.25)
    assert sink.phases == [("logging", 0.1), ("optimizer", 0.4), ("checkpoint", 0.0)]
    assert sink.collectives == [("barrier", "optimizer", 0.5), ("all_gather", "", 0.5)]
    assert sink.steps == [1.75]
    assert t.current_phase() is None and t.phase_totals()["optimizer"] == pytest.approx(0.4)


def test_live_reads_never_count_a_phase_opened_inside_a_wait(parts):
    t, sink, clock = parts
    t.enter("forward")
    clock.tick(1.0)
    began = t.wait_begin()
    t.enter("eval")
    clock.tick(2.0)
    assert t.phase_totals() == {"forward": 1.0, "eval": 0.0}
    t.wait_end("all_reduce", began)
    clock.tick(0.5)
    assert t.phase_totals() == {"forward": 1.0, "eval": 0.5}


def test_live_reads_never_count_a_wait_in_progress():
    """The exporter reads open phases mid-wait: the wait is not in them, then or later."""
    sink = Sink()
    t = Timer(sink)
    waiting, release = threading.Event(), threading.Event()

    def rank():
        with t.phase("data_wait"):
            began = t.wait_begin()
            waiting.set()
            release.wait(5)
            t.wait_end("all_gather", began)

    th = threading.Thread(target=rank)
    th.start()
    waiting.wait(5)
    first = t.phase_totals()["data_wait"]
    threading.Event().wait(0.2)
    second = t.phase_totals()["data_wait"]
    release.set()
    th.join(5)
    assert second - first < 0.01               # paused: 0.2 s passed, the phase did not grow
    (kind, phase, waited), = sink.collectives
    assert (kind, phase) == ("all_gather", "data_wait") and waited >= 0.2
    assert dict(sink.phases)["data_wait"] < 0.05


def test_a_broken_timer_still_returns_the_wait(parts):
    t, sink, clock = parts
    with t.phase("forward"):
        began = t.wait_begin()
        t.broken = True
        clock.tick(0.3)
        assert t.wait_end("all_reduce", began) == pytest.approx(0.3)
    assert sink.collectives == []


# ---- otel_gpu.training.collective() around a collective that is timed itself: one wait, counted once ----

class Work:
    """Stands for torch's Work type (what an async_op=True call returns)."""


@pytest.fixture
def session_timer(monkeypatch, parts):
    from types import SimpleNamespace

    from otel_gpu.training import session

    t, sink, clock = parts
    monkeypatch.setattr(session, "_session", SimpleNamespace(timer=t))
    return t, sink, clock


def fake_collective(clock: Clock, seconds: float, kind: str):
    """A torch.distributed function as `collectives.install()` wraps it, blocking `seconds`."""
    from otel_gpu.training import collectives

    return collectives._timed(lambda: clock.tick(seconds), kind, Work)


def test_user_collective_around_a_timed_torch_collective_counts_once(session_timer):
    from otel_gpu import training as otg

    t, sink, clock = session_timer
    all_reduce = fake_collective(clock, 0.3, "all_reduce")
    with t.step():
        with t.phase("optimizer"):
            clock.tick(0.1)
            with otg.collective("mpi_allreduce"):
                clock.tick(0.05)                 # the user's own library
                all_reduce()                     # and a torch collective inside the same wait
            clock.tick(0.02)
            all_reduce()                         # alone: counted by its own wrapper
    assert sink.collectives == [("mpi_allreduce", "optimizer", 0.35), ("all_reduce", "optimizer", 0.3)]
    assert sink.phases == [("optimizer", 0.12)]  # neither wait is the phase's own time, none taken twice
    assert sink.steps == [0.77]


def test_nested_user_collectives_count_once_under_the_outer_kind(session_timer):
    from otel_gpu import training as otg

    t, sink, clock = session_timer
    with t.phase("data_wait"):
        with otg.collective("barrier"):
            clock.tick(0.1)
            with otg.collective("broadcast"):
                clock.tick(0.2)
            clock.tick(0.1)
        clock.tick(0.01)
    assert sink.collectives == [("barrier", "data_wait", 0.4)] and sink.phases == [("data_wait", 0.01)]


def test_user_collective_outside_phases_counts_only_inside_a_step(session_timer):
    from otel_gpu import training as otg

    t, sink, clock = session_timer
    with otg.collective("barrier"):              # set-up, before training
        clock.tick(1.0)
    with t.step():
        with otg.collective("barrier"):
            clock.tick(0.2)
    assert sink.collectives == [("barrier", "", 0.2)]


def test_a_torch_collective_after_the_user_wait_is_timed_again(session_timer):
    """The flag is per wait: once the outer wait ends (normally or by an error) torch calls count again."""
    from otel_gpu import training as otg

    t, sink, clock = session_timer
    all_gather = fake_collective(clock, 0.1, "all_gather")
    with t.step():
        with pytest.raises(RuntimeError):
            with otg.collective("mpi_gather"):
                clock.tick(0.2)
                raise RuntimeError("peer lost")
        all_gather()
    assert sink.collectives == [("mpi_gather", "", 0.2), ("all_gather", "", 0.1)]


REAL_NESTED = """
import json, os, sys, types
import torch, torch.distributed as dist
from otel_gpu import training as otg
from otel_gpu.training import collectives, session
from otel_gpu.training.timing import Timer

class Sink:
    coll = []
    def step(self, *a): pass
    def phase(self, *a): pass
    def checkpoint(self, *a): pass
    def collective(self, kind, phase, seconds): self.coll.append((kind, phase))

sink = Sink()
session._session = types.SimpleNamespace(timer=Timer(sink))
collectives.install()
dist.init_process_group("gloo", rank=0, world_size=1)
x = torch.ones(8)
t = session._session.timer
with t.step():
    with otg.phase("logging"):
        with otg.collective("mpi"):
            dist.all_reduce(x)
            dist.all_gather_into_tensor(torch.empty(8), x, async_op=True).wait()
        dist.barrier()
dist.destroy_process_group()
print(json.dumps(sink.coll))
"""


def test_real_torch_collectives_inside_a_user_collective_count_once():
    import json
    import subprocess
    import sys

    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    from tests.childenv import clean_env
    from tests.servers import free_port

    env = clean_env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    p = subprocess.run([sys.executable, "-c", REAL_NESTED], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [["mpi", "logging"], ["barrier", "logging"]]
