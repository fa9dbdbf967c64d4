"""A plain loop's evaluation passes as the "eval" phase, outside the steps (otel_gpu/training/forward.py,
torch_hooks.py, the timer), in-process with a real session and torch: `model.eval()` + `no_grad`,
`no_grad` alone, `inference_mode`, `model.eval()` alone; a frozen teacher under `no_grad` inside a
step stays forward; an evaluation on another thread leaves the steps alone."""
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402

from otel_gpu.training import forward, session, torch_hooks  # noqa: E402
from otel_gpu.training.timing import Timer  # noqa: E402

TRAIN_S, EVAL_S = 0.01, 0.02    # host time of one training / one evaluation forward


class Net(torch.nn.Module):
    """A model whose forward sleeps: `train_s` with gradients on in training mode, else `eval_s`."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        time.sleep(TRAIN_S if torch.is_grad_enabled() and self.training else EVAL_S)
        return self.lin(x)


class Steps:
    """The timer's sink, keeping each step's seconds."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, []

    def step(self, seconds, samples, tokens):
        self.seconds.append(seconds)
        self.inner.step(seconds, samples, tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture
def timer():
    old = session._session
    s = session._session = session.Session({}, readers=[InMemoryMetricReader()], profile=False, host="h")
    torch_hooks.uninstall()
    torch_hooks.install()
    s.timer.sink = Steps(s.timer.sink)
    yield s.timer
    torch_hooks.uninstall()
    s.shutdown(1.0)
    session._session = old


def _loader(n: int):
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(n, 4), torch.randn(n, 4)),
                                       batch_size=1)


def _train(model, loss_fn, opt, batches: int):
    for x, y in _loader(batches):
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _evaluate(model, loss_fn, batches: int, how: str) -> float:
    """One evaluation pass the way users write it; its wall seconds."""
    t0 = time.perf_counter()
    if how in ("eval+no_grad", "eval"):
        model.eval()
    ctx = {"eval+no_grad": torch.no_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode,
           "eval": torch.enable_grad}[how]
    with ctx():
        total = 0.0
        for x, y in _loader(batches):
            total += float(loss_fn(model(x), y).detach())
    model.train()
    return time.perf_counter() - t0


@pytest.mark.parametrize("how", ["eval+no_grad", "no_grad", "inference_mode", "eval"])
def test_an_evaluation_pass_is_eval_and_not_in_any_step(timer, how):
    model, loss_fn = Net(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train(model, loss_fn, opt, 5)
    forward_before = timer.phase_totals().get("forward", 0.0)
    eval_s = _evaluate(model, loss_fn, 6, how)     # 6 x 20 ms
    _train(model, loss_fn, opt, 5)                 # the step opened by the 5th optimizer step holds the pass
    totals = timer.phase_totals()
    steps = timer.sink.seconds
    assert 0.12 <= totals["eval"] <= eval_s + 0.01, (totals, eval_s)
    assert totals["eval"] >= 0.9 * eval_s, (totals, eval_s)   # the batches and the loss too, not only the model
    # the training forwards after the pass (5 x 10 ms) and no evaluation forward
    assert 0.05 <= totals["forward"] - forward_before < 0.05 + 0.04, totals
    assert len(steps) == 9                         # 10 optimizer steps: the first opens the count; none added
    assert max(steps) < 0.05, steps                # no step absorbed the 120 ms pass
    assert timer.current_phase() is None and not forward.eval_open()


def test_the_pass_ends_at_the_first_training_batch_fetch(timer):
    model, loss_fn = Net(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train(model, loss_fn, opt, 3)
    _evaluate(model, loss_fn, 3, "eval+no_grad")
    assert timer.current_phase() == "eval"         # still open after the loop: the pass's bookkeeping is eval
    it = iter(_loader(2))
    next(it)                                       # a training batch: gradients on, the model training again
    assert timer.current_phase() is None and not forward.eval_open()
    assert "data_wait" in timer.phase_totals()


def test_a_frozen_teacher_inside_the_step_is_forward(timer):
    student, teacher, loss_fn = Net(), Net().eval(), torch.nn.MSELoss()
    opt = torch.optim.SGD(student.parameters(), lr=0.01)
    for x, y in _loader(6):
        with torch.no_grad():
            target = teacher(x)                   # 20 ms, never trained: not an evaluation
        loss_fn(student(x), target).backward()
        opt.step()
        opt.zero_grad()
    totals = timer.phase_totals()
    assert "eval" not in totals and totals["forward"] >= 6 * (TRAIN_S + EVAL_S), totals
    assert min(timer.sink.seconds) >= TRAIN_S + EVAL_S


def test_evaluating_with_gradients_on_keeps_the_loss_module_inside_the_pass(timer):
    model, loss_fn = Net(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    _train(model, loss_fn, opt, 3)
    model.eval()
    for x, y in _loader(3):
        loss_fn(model(x), y)                      # the loss module trains in training mode: it ends nothing
        assert timer.current_phase() == "eval"
    model.train()
    _train(model, loss_fn, opt, 2)
    assert timer.phase_totals()["eval"] >= 3 * EVAL_S


def test_an_evaluation_on_another_thread_leaves_the_steps_alone():
    class Sink:
        def __init__(self):
            self.steps = []

        def step(self, seconds, samples, tokens):
            self.steps.append(seconds)

        def phase(self, name, seconds):
            pass

        def checkpoint(self, event):
            pass

        def collective(self, kind, phase, seconds):
            pass

    t = Timer(Sink())
    t.begin_step("user")
    th = threading.Thread(target=lambda: (t.enter("eval"), time.sleep(0.05), t.exit("eval")))
    th.start()
    th.join()
    time.sleep(0.01)
    t.end_step("user")
    with t.step():                                 # the same thread: the eval inside is not step time
        with t.phase("eval"):
            time.sleep(0.05)
        time.sleep(0.01)
    assert t.sink.steps[0] >= 0.06 and 0.01 <= t.sink.steps[1] < 0.04, t.sink.steps


class SlowData(torch.utils.data.Dataset):
    """`n` samples that take `seconds` each to produce (a decode)."""

    def __init__(self, n: int, seconds: float):
        self.n, self.seconds = n, seconds
        self.x, self.y = torch.randn(n, 4), torch.randn(n, 4)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return self.x[i], self.y[i]


@pytest.mark.parametrize("how", ["eval+no_grad", "no_grad", "eval"])
def test_an_evaluation_loaders_first_batch_is_the_evaluations(timer, how):
    """The pass's first batch is fetched before the model call that would open it: the loader, iterated with
    gradients off or the trained model in eval mode, opens it, so the fetch is neither data wait nor step."""
    model, loss_fn = Net(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = _loader(4)
    for _ in range(2):
        for x, y in train:
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        waited = timer.phase_totals().get("data_wait", 0.0)
        val = torch.utils.data.DataLoader(SlowData(3, 0.04), batch_size=1)
        if how != "no_grad":
            model.eval()
        with torch.enable_grad() if how == "eval" else torch.no_grad():
            for x, y in val:                       # 3 x (40 ms fetch + 20 ms model)
                loss_fn(model(x), y)
        model.train()
        assert timer.current_phase() == "eval"
        assert timer.phase_totals().get("data_wait", 0.0) - waited < 0.01   # no fetch of the pass is data wait
    totals = timer.phase_totals()
    assert totals["eval"] >= 2 * 3 * (0.04 + EVAL_S), totals
    assert max(timer.sink.seconds) < 0.05, timer.sink.seconds   # the step holding a pass: without its fetches


def test_a_loop_that_calls_train_after_its_fetch_ends_the_pass_at_the_fetch(timer):
    """`for batch in loader: model.train(); ...` after an evaluation that left the model in eval mode: the
    first training batch of the next epoch is fetched in eval mode, from the training data: data wait."""
    model, loss_fn = Net(), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = torch.utils.data.DataLoader(SlowData(4, 0.03), batch_size=1)
    for _ in range(2):
        for x, y in train:
            model.train()
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for x, y in _loader(2):
                model(x)
    totals = timer.phase_totals()
    assert totals["data_wait"] >= 8 * 0.03, totals             # every training fetch, the second epoch's first too
    assert totals["eval"] < 2 * 2 * (EVAL_S + 0.01), totals     # the passes only


def test_a_save_inside_an_evaluation_stays_in_the_step():
    """A checkpoint nested in eval: the step start moves by eval's own seconds and its waits only, so the
    save stays step time, where the diagnosis subtracts it (unphased = step time minus the phases)."""
    from otel_gpu.diagnose.model import RankStats
    from otel_gpu.diagnose.unphased import unphased

    class Sink:
        def __init__(self):
            self.steps, self.phases, self.waits = [], {}, {}

        def step(self, seconds, samples, tokens):
            self.steps.append(seconds)

        def phase(self, name, seconds):
            self.phases[name] = self.phases.get(name, 0.0) + seconds

        def checkpoint(self, event):
            pass

        def collective(self, kind, phase, seconds):
            self.waits[phase] = self.waits.get(phase, 0.0) + seconds

    now = [0.0]
    t = Timer(Sink(), clock=lambda: now[0])
    t.begin_step("user")
    now[0] += 0.2                                 # outside every phase
    t.enter("eval")
    now[0] += 0.5
    t.enter("checkpoint")                         # the pass saves the best model
    now[0] += 1.0
    t.exit("checkpoint")
    began = t.wait_begin()
    now[0] += 0.2                                 # its metric all-reduce
    t.wait_end("all_reduce", began)
    now[0] += 0.3
    t.exit("eval")
    now[0] += 0.1
    t.end_step("user")
    s = t.sink
    assert s.phases == pytest.approx({"eval": 0.8, "checkpoint": 1.0}) and s.waits == pytest.approx({"eval": 0.2})
    assert s.steps == pytest.approx([1.3])        # 2.3 s of wall time less eval's 0.8 s and its 0.2 s wait
    r = RankStats(rank="0", host="h", steps=1, step_time_s=s.steps[0], step_count=1, phases=s.phases,
                  collective_s=0.0, collective_by_phase=s.waits)
    out, share = unphased(r)
    assert out == pytest.approx(0.3)              # the 0.2 s before the pass and the 0.1 s after it
