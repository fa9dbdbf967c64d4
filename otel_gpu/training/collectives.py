"""Time each rank spends blocked in torch.distributed collectives, with no code change.

What is measured (host wall clock, on the thread that blocks), inside counted steps:
- a synchronous collective (`dist.all_reduce(t)`, `all_gather_into_tensor`, `barrier`, ...): the call;
- an asynchronous one (`async_op=True`): the call, then the `Work.wait()` that blocks on it, under the
  kind of the call (DeepSpeed ZeRO-3's parameter fetches and gradient reduces wait this way);
- DistributedDataParallel's gradient all-reduce, which C++ runs overlapped with backward: from the end of
  backward's computation to the completion of the last bucket (`ddp_allreduce`), through a communication
  hook that does what DDP does without one (divide by the world size, all-reduce).
A synchronous call waits on its own Work inside, and some collectives call others: nested calls count once,
and so does a torch collective inside `waiting()` (the user's `otel_gpu.training.collective()`).

These are exported with `otelgpu.collective.basis="host"`. With NCCL (CUDA) the calls and
`Work.wait()` return at once: the GPU stream waits, not the host, and host timing would report
near-zero waits, a silent wrong number. So a process whose default group is NCCL times nothing here
and starts the Flight Recorder poller instead (gpu_collectives.py: GPU-timed, basis "gpu").
"""
from __future__ import annotations

import functools
import logging
import threading
from contextlib import contextmanager
from typing import Iterator

from . import session

log = logging.getLogger("otel_gpu.training")

# torch.distributed function -> the collective kind it is counted under
KINDS = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_coalesced": "all_gather", "all_gather_object": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "broadcast": "broadcast", "broadcast_object_list": "broadcast",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "reduce": "reduce", "gather": "gather", "gather_object": "gather", "scatter": "scatter",
    "scatter_object_list": "scatter", "send": "send", "recv": "recv", "isend": "send", "irecv": "recv",
    "batch_isend_irecv": "send_recv",
}
DDP_KIND = "ddp_allreduce"
MAX_PENDING = 4096   # async Works remembered until waited (kind, call time); past this all are forgotten

_local = threading.local()          # .inside: this thread is inside one of our timed calls
_pending: dict[int, tuple[str, float]] = {}   # id(Work) -> (kind of the call that returned it, seconds in the call)
_installed: list = []               # (owner, attribute, original) to undo


_host_blocking: list[bool] = []   # [answer] once known: does this process's default group block the host?


def host_blocking() -> bool:
    """False when the default process group is NCCL (collectives return before the GPU has waited)."""
    if _host_blocking:
        return _host_blocking[0]
    import torch.distributed as dist

    if not dist.is_initialized():
        return True
    _host_blocking.append("nccl" not in str(dist.get_backend()).lower())
    if not _host_blocking[0]:
        _start_gpu_timing()
    return _host_blocking[0]


def _start_gpu_timing() -> None:
    """NCCL: the GPU-timed collective time of every group, from the Flight Recorder (once per process)."""
    s = session._session
    if s is None:
        return
    from . import gpu_collectives
    try:
        gpu_collectives.start(s.sink, lambda: s.sink.first_step_ns)
    except Exception as exc:   # an unknown torch: train unmeasured rather than fail
        s.sink.unmeasured(gpu_collectives.NO_RECORDER, 1)
        log.warning("otel-gpu: NCCL collective time not measured: %r", exc)


def _timer():
    """The session's timer when this process's collectives block the host, else None (cheap: per call)."""
    s = session._session
    t = s.timer if s is not None else session.timer()
    if t is None or t.broken or not host_blocking():
        return None
    return t


@contextmanager
def waiting(kind: str) -> Iterator[None]:
    """This thread blocks in a collective of `kind` for the body (one of the caller's own library: MPI, a
    custom backend): the body's seconds are the rank's collective wait, its phase paused meanwhile, as for
    a torch collective. A wait already open on this thread (this inside a timed torch call, or a torch
    collective inside this) is counted by the outer one only, once."""
    if getattr(_local, "inside", False):
        yield
        return
    t = session.timer()
    if t is None or t.broken:
        yield
        return
    _local.inside = True
    began = t.wait_begin(kind)
    try:
        yield
    finally:
        _local.inside = False
        t.wait_end(kind, began)


def _timed(fn, kind: str, work_type):
    """`fn` timed as `kind`; a Work it returns carries the kind and the call's time to its wait().
    The thread's current phase is paused while it blocks (the wait is not that phase's own time)."""

    @functools.wraps(fn)
    def collective(*args, **kwargs):
        if getattr(_local, "inside", False):
            return fn(*args, **kwargs)
        t = _timer()
        if t is None:
            return fn(*args, **kwargs)
        _local.inside = True
        began = t.wait_begin(kind)
        result = None
        try:
            result = fn(*args, **kwargs)
        finally:
            _local.inside = False
            if type(result) is work_type:   # counted with its wait, once, under the wait's phase
                if len(_pending) >= MAX_PENDING:
                    _pending.clear()
                _pending[id(result)] = (kind, t.wait_end(None, began))
            else:
                t.wait_end(kind, began)
        return result

    collective._otelgpu = True
    return collective


def _timed_wait(original):

    @functools.wraps(original)
    def wait(self, *args, **kwargs):
        kind, took = _pending.pop(id(self), ("async", 0.0))
        if getattr(_local, "inside", False):
            return original(self, *args, **kwargs)
        t = _timer()
        if t is None:
            return original(self, *args, **kwargs)
        _local.inside = True
        began = t.wait_begin(kind)
        try:
            return original(self, *args, **kwargs)
        finally:
            _local.inside = False
            t.wait_end(kind, began, took)

    wait._otelgpu = True
    return wait


def _patch(owner, name: str, make) -> None:
    original = getattr(owner, name, None)
    if original is None or getattr(original, "_otelgpu", False):
        return
    setattr(owner, name, make(original))
    _installed.append((owner, name, original))


# ---- DistributedDataParallel ------------------------------------------------------------------

def _ddp_hook(inner):
    """A DDP communication hook around `inner` (a hook function) that measures the host's wait for the
    last bucket: our autograd callback runs just before DDP's own finalizer and waits on the buckets'
    futures, which DDP would wait on next anyway (so the step is not delayed)."""

    def hook(state, bucket):
        outer = getattr(_local, "inside", False)   # a wait the user times around backward stays open
        _local.inside = True
        try:
            fut = inner(state, bucket)
        finally:
            _local.inside = outer
        futures = _ddp_futures()
        futures.append(fut)
        if bucket.is_last():
            _local.ddp_futures = []
            _queue_wait(futures)
        return fut

    hook.__name__ = getattr(inner, "__name__", "hook")
    hook.__qualname__ = getattr(inner, "__qualname__", hook.__name__)
    return hook


def _ddp_futures() -> list:
    futures = getattr(_local, "ddp_futures", None)
    if futures is None:
        futures = _local.ddp_futures = []
    return futures


def _queue_wait(futures: list) -> None:
    from torch.autograd import Variable

    def wait_for_buckets():
        t = session.timer()
        if t is None or getattr(_local, "inside", False):   # inside a wait timed around it: counted there
            return
        kind = DDP_KIND
        began = t.wait_begin(kind)
        try:
            for fut in futures:
                fut.wait()
        except Exception as exc:   # DDP's finalizer waits on the same futures next and raises the error itself
            log.debug("otel-gpu: a DDP bucket failed: %r", exc)
            kind = None
        finally:
            t.wait_end(kind, began)

    Variable._execution_engine.queue_callback(wait_for_buckets)


def _average(process_group, bucket):
    """What DDP does without a communication hook: average the bucket over the group (divide by its
    size, all-reduce); the division is skipped for a group of one, as DDP's own path costs nothing there."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    size = group.size()
    if size > 1:
        tensor.div_(size)
    work = dist.all_reduce(tensor, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _patch_ddp(ddp_class) -> None:
    """DDP.forward is the forward phase and registers the timing hook at the first call (unless the user
    registered a builtin hook); a user's own Python hook is wrapped so it is timed the same way."""

    def make_register(original):
        @functools.wraps(original)
        def register_comm_hook(self, state, hook):
            self._otelgpu_hooked = True
            return original(self, state, _ddp_hook(hook))

        register_comm_hook._otelgpu = True
        return register_comm_hook

    def make_builtin(original):
        @functools.wraps(original)
        def register_builtin_comm_hook(self, comm_hook_type):
            self._otelgpu_hooked = True   # C++ hooks cannot be wrapped: this model's wait is not measured
            return original(self, comm_hook_type)

        register_builtin_comm_hook._otelgpu = True
        return register_builtin_comm_hook

    def make_forward(original):
        @functools.wraps(original)
        def forward(self, *args, **kwargs):
            t = session.timer()
            if t is None:
                return original(self, *args, **kwargs)
            if not getattr(self, "_otelgpu_hooked", False) and host_blocking():
                self._otelgpu_hooked = True
                try:
                    self.register_comm_hook(self.process_group, _average)
                except Exception as exc:   # an unknown DDP version: train unmeasured rather than fail
                    log.warning("otel-gpu: DDP all-reduce wait not measured: %r", exc)
            if t.current_phase() == "eval":   # an evaluation pass stays eval
                return original(self, *args, **kwargs)
            t.enter("forward")
            try:
                return original(self, *args, **kwargs)
            finally:
                t.exit("forward")

        forward._otelgpu = True
        return forward

    _patch(ddp_class, "register_comm_hook", make_register)
    _patch(ddp_class, "register_builtin_comm_hook", make_builtin)     # public before torch 2.x's rename
    _patch(ddp_class, "_register_builtin_comm_hook", make_builtin)
    _patch(ddp_class, "forward", make_forward)


# ---- install ----------------------------------------------------------------------------------

def install() -> bool:
    """Time every torch.distributed collective and DDP's all-reduce wait; False without torch.distributed."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    from torch.distributed import distributed_c10d as c10d

    work = getattr(c10d, "Work", None) or getattr(dist, "Work", None)
    for name, kind in KINDS.items():
        for owner in (dist, c10d):
            _patch(owner, name, lambda fn, kind=kind: _timed(fn, kind, work))
    if work is not None:
        _patch(work, "wait", _timed_wait)
    from torch.nn.parallel import DistributedDataParallel
    _patch_ddp(DistributedDataParallel)
    return True


def uninstall() -> None:
    """Restore every patched function (tests)."""
    while _installed:
        owner, name, original = _installed.pop()
        setattr(owner, name, original)
    _pending.clear()
    _host_blocking.clear()
