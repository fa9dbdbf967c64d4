"""The model call as "forward" (otel_gpu/training/forward.py), in-process with a real session and torch."""
import time

import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402

from otel_gpu.training import forward, session, torch_hooks  # noqa: E402


class Sleepy(torch.nn.Module):
    """A block whose forward takes `sleep_s` of host time and calls two child modules."""

    def __init__(self, sleep_s: float):
        super().__init__()
        self.sleep_s = sleep_s
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

    def forward(self, x):
        time.sleep(self.sleep_s)
        return self.inner(x)


@pytest.fixture
def timer():
    """A real session as this process's session, with the torch hooks installed; removed after."""
    old = session._session
    s = session._session = session.Session({}, readers=[InMemoryMetricReader()], profile=False, host="h")
    torch_hooks.install()
    forward.uninstall()
    forward.install()
    yield s.timer
    forward.uninstall()
    torch_hooks.uninstall()
    s.shutdown(1.0)
    session._session = old


def _ours_registered() -> bool:
    return any(h is forward._global_pre for h in nn_module._global_forward_pre_hooks.values())


def _step(model, loss_fn, opt):
    loss = loss_fn(model(torch.randn(2, 4)), torch.randn(2, 4))
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_the_model_call_is_forward_once_and_the_search_ends_after_a_step(timer):
    model, loss_fn = torch.nn.Sequential(Sleepy(0.02), torch.nn.Linear(4, 4)), torch.nn.MSELoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    assert _ours_registered()
    for _ in range(4):
        _step(model, loss_fn, opt)
    totals = timer.phase_totals()
    # 4 calls of 20 ms: the nested modules (Sleepy, its Sequential, Linear, ReLU) do not add theirs again
    assert 0.08 <= totals["forward"] < 0.08 + 0.06, totals
    assert not _ours_registered() and not forward.searching()
    assert len(forward._roots) == 2          # the model and the loss module, nothing inside them
    assert timer.current_phase() is None


def test_a_model_called_inside_a_phase_keeps_that_phase(timer):
    model = Sleepy(0.05)
    with timer.phase("eval"):
        with torch.no_grad():
            model(torch.randn(2, 4))
    with timer.phase("forward"):                  # an integration's own forward: counted once (twice: >= 0.1)
        model(torch.randn(2, 4))
    totals = timer.phase_totals()
    assert totals["eval"] >= 0.05 and 0.05 <= totals["forward"] < 0.09, totals
    assert forward._roots == []                   # nothing adopted: every call was inside a phase
    # two step boundaries with no model found outside a phase: the search gives up
    timer.mark_step("optimizer")
    timer.mark_step("optimizer")
    model(torch.randn(2, 4))
    assert not _ours_registered()


def test_a_root_that_raises_closes_its_phase_and_a_later_call_inside_eval_is_not_forward(timer):
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise ValueError("user bug")

    boom, model = Boom(), Sleepy(0.0)
    with pytest.raises(ValueError):
        boom(torch.randn(1))
    assert timer.current_phase() is None
    model(torch.randn(2, 4))                      # adopted as a root
    assert model in forward._adopted
    before = timer.phase_totals().get("forward", 0.0)
    model.sleep_s = 0.03
    with timer.phase("eval"):
        model(torch.randn(2, 4))                  # its own hook sees eval open: not forward
    assert timer.phase_totals().get("forward", 0.0) - before < 0.005
    assert not timer.broken


def test_off_when_telemetry_is_off():
    old = session._session, session._disabled
    session._session, session._disabled = None, True
    try:
        forward.uninstall()
        forward.install()
        assert _ours_registered()
        Sleepy(0.0)(torch.randn(2, 4))
        assert not _ours_registered() and forward._roots == []
    finally:
        forward.uninstall()
        session._session, session._disabled = old
