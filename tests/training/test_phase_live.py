"""Timer.phase_totals: open phases count up to now, once, monotone, across threads, without raising."""
import sys
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.training.timing import Timer


class ListSink:
    def __init__(self):
        self.phases = []

    def step(self, seconds, samples, tokens):
        pass

    def phase(self, name, seconds):
        self.phases.append((name, seconds))

    def checkpoint(self, event):
        pass


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_an_open_save_is_counted_up_to_each_read_and_once_when_it_ends():
    clock, sink = Clock(), ListSink()
    t = Timer(sink, clock=clock)
    t.enter("checkpoint")
    reads = []
    for _ in range(3):          # a 3 s save read by three exports, one a second
        clock.t += 1.0
        reads.append(t.phase_totals()["checkpoint"])
    clock.t += 0.5
    t.exit("checkpoint")
    reads.append(t.phase_totals()["checkpoint"])
    clock.t += 2.0              # nothing open: no more time
    reads.append(t.phase_totals()["checkpoint"])
    assert reads == [1.0, 2.0, 3.0, 3.5, 3.5]
    assert sink.phases == [("checkpoint", 3.5)]   # the sink still gets the whole phase at its end


def test_nested_phases_are_exclusive_while_open():
    clock = Clock()
    t = Timer(ListSink(), clock=clock)
    t.enter("optimizer")
    clock.t += 1.0
    t.enter("checkpoint")
    clock.t += 2.0
    assert t.phase_totals() == {"optimizer": 1.0, "checkpoint": 2.0}
    t.exit("checkpoint")
    clock.t += 0.25
    assert t.phase_totals() == {"optimizer": 1.25, "checkpoint": 2.0}
    t.enter("optimizer")        # re-entry of the open phase: counted once
    clock.t += 0.25
    t.exit("optimizer")
    t.exit("optimizer")
    assert t.phase_totals() == {"optimizer": 1.5, "checkpoint": 2.0}


def test_threads_add_up_and_an_ended_thread_keeps_its_time_but_leaves_the_list():
    t = Timer(ListSink())

    def worker():
        with t.phase("eval"):
            time.sleep(0.05)

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    with t.phase("forward"):
        time.sleep(0.02)
        open_read = t.phase_totals()
    assert open_read["eval"] >= 0.05 and open_read["forward"] >= 0.02
    final = t.phase_totals()
    assert final["eval"] == open_read["eval"] and final["forward"] >= open_read["forward"]
    assert len(t._threads) == 1   # the ended thread was folded into the retired totals


def test_a_reader_racing_a_busy_training_thread_never_counts_twice_nor_goes_back():
    """Real threads: the training thread enters and leaves nested phases as fast as it can while
    the reader reads; on one thread exclusive phases cannot add up to more than the wall time."""
    sink = ListSink()
    t = Timer(sink)
    stop = threading.Event()
    start = time.perf_counter()

    def train():
        while not stop.is_set():
            with t.phase("forward"):
                with t.phase("backward"):
                    pass
            with t.phase("checkpoint"):
                pass

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)   # switch threads often: reads land inside the hot path's updates
    th = threading.Thread(target=train)
    th.start()
    last, reads = {}, 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            totals = t.phase_totals()
            elapsed = time.perf_counter() - start
            assert sum(totals.values()) <= elapsed + 1e-6, (totals, elapsed)
            assert all(totals.get(k, 0.0) >= v for k, v in last.items()), (last, totals)
            last, reads = totals, reads + 1
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(switch)
    closed = {}
    for name, seconds in sink.phases:
        closed[name] = closed.get(name, 0.0) + seconds
    final = t.phase_totals()
    assert reads > 50 and set(final) == {"forward", "backward", "checkpoint"}
    assert all(abs(final[k] - closed[k]) < 1e-6 for k in closed), (final, closed)


def test_a_reader_error_returns_the_last_totals_and_training_goes_on():
    clock = Clock()
    t = Timer(ListSink(), clock=clock)
    t.enter("forward")
    clock.t += 1.0
    assert t.phase_totals() == {"forward": 1.0}
    t._threads.append(None)     # a corrupt entry: the read fails inside
    assert t.phase_totals() == {"forward": 1.0}
    t._threads.pop()
    clock.t += 1.0
    t.exit("forward")
    assert not t.broken and t.phase_totals() == {"forward": 2.0}


OPS = st.lists(st.one_of(st.tuples(st.just("enter"), st.sampled_from(["forward", "backward", "checkpoint"])),
                         st.tuples(st.just("exit"), st.sampled_from(["forward", "backward", "checkpoint"])),
                         st.tuples(st.just("tick"), st.floats(0.0, 5.0)),
                         st.tuples(st.just("read"), st.none())), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_any_sequence_reads_monotone_within_wall_time_and_ends_at_the_closed_sum(ops):
    clock, sink = Clock(), ListSink()
    t = Timer(sink, clock=clock)
    last = {}
    for op, arg in ops:
        if op == "enter":
            t.enter(arg)
        elif op == "exit":
            t.exit(arg)
        elif op == "tick":
            clock.t += arg
        else:
            totals = t.phase_totals()
            assert sum(totals.values()) <= clock.t - 100.0 + 1e-9
            assert all(totals.get(k, 0.0) >= v for k, v in last.items())
            last = totals
    t.unwind()
    closed = {}
    for name, seconds in sink.phases:
        closed[name] = closed.get(name, 0.0) + seconds
    final = t.phase_totals()
    assert set(final) >= set(closed)
    assert all(abs(final[k] - closed[k]) < 1e-9 for k in closed)
    assert not t.broken


def test_the_session_exports_an_open_phase_at_each_collection():
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gpu import names
    from otel_gpu.training.session import Session

    reader = InMemoryMetricReader()
    s = Session({}, readers=[reader], profile=False, host="h")

    def checkpoint_s():
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == names.TRAIN_PHASE_TIME.name:
                        return {p.attributes[names.PHASE]: p.value for p in m.data.data_points}.get("checkpoint")
        return None

    try:
        s.timer.enter("checkpoint")
        time.sleep(0.05)
        first = checkpoint_s()
        time.sleep(0.05)
        second = checkpoint_s()
        s.timer.exit("checkpoint")
        final = checkpoint_s()
        assert 0.05 <= first < second < final, (first, second, final)
        assert abs(final - s.sink.phase_s["checkpoint"]) < 1e-9   # the whole save once, not once more at its end
    finally:
        s.shutdown(1.0)
