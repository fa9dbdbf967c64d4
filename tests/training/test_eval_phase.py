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
