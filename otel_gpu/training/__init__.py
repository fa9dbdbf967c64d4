"""Training-side telemetry: step time, throughput and phases per rank, plus phase-tagged profiles.

Plain PyTorch loop::

    from otel_gpu import training as otg

    for batch in loader:
        with otg.step(samples=len(batch)):
            with otg.phase("forward"):
                loss = model(batch)
            with otg.phase("backward"):
                loss.backward()
            with otg.phase("optimizer"):
                opt.step()
        if it % 1000 == 0:
            with otg.checkpoint():
                torch.save(model.state_dict(), path)

Integrations: `otel_gpu.training.hf` (Trainer callback), `.lightning` (callback),
`.deepspeed` (engine), `.torch_hooks` (any optimizer, no code change). Nothing here
raises into the training loop, and nothing waits for the GPU.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from ..names import PHASE_NAMES
from . import session as _session

__all__ = ["step", "phase", "checkpoint", "collective", "shutdown", "PHASE_NAMES"]


def _measure_torch() -> None:
    """Data wait, backward and collective wait are measured for every loop that uses torch, instrumented
    by hand or not (`otel-gpu run` installs the same hooks at import). Run when the session starts; kept
    here so that the session never imports the hook modules (they import it)."""
    import sys
    if "torch" not in sys.modules:
        return
    from . import collectives, torch_hooks
    torch_hooks.install_phases()
    collectives.install()


_session.ON_START.append(_measure_torch)


@contextmanager
def step(samples: float | None = None, tokens: float | None = None) -> Iterator[None]:
    """Time one training step of this rank; `samples`/`tokens` it processed, when known."""
    t = _session.timer()
    if t is None:
        yield
        return
    t.begin_step("user")
    try:
        yield
    finally:
        t.end_step("user", samples, tokens)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time a phase (forward, backward, optimizer, checkpoint, eval, data_wait, or your own name)
    and tag the profile samples of this thread with it."""
    t = _session.timer()
    if t is None:
        yield
        return
    t.enter(name)
    try:
        yield
    finally:
        t.exit(name)


@contextmanager
def collective(kind: str) -> Iterator[None]:
    """Time this thread is blocked in a collective of its own library (MPI, a custom backend) as the
    rank's collective wait of `kind` (torch.distributed collectives are timed without this; one called
    inside is counted once, here). The current phase is paused meanwhile: the wait is not its own time."""
    from . import collectives
    with collectives.waiting(kind):
        yield


def checkpoint():
    """`phase("checkpoint")`: also counts checkpoint start and end events."""
    return phase("checkpoint")


def shutdown(timeout_s: float = _session.EXIT_TIMEOUT_S) -> None:
    """Flush and stop now (otherwise done at exit)."""
    s = _session._session
    if s is not None:
        s.shutdown(timeout_s)
