"""The model call of a plain loop is the "forward" phase, with no per-module cost for the run.

A global forward pre-hook (which makes every module call in the process take torch's slower hook
path) is registered only while the model is being found. The first module called on a thread
with no phase open is the outermost module of that call: the modules it calls see "forward"
open and are left alone. That root module gets hooks of its own (only its calls pay for them)
and its call is timed as "forward"; so is any other module called outside a phase while the
global hook lives (a loss module called after the model, as the HF Trainer's `compute_loss`
and Lightning's forward span include the loss). The global hook is removed at its first call
after the first step boundary that follows the first root, after two step boundaries with no
root (an integration already times forward: the HF Trainer, Lightning, a DeepSpeed engine, a
hand-written `phase("forward")`), after `MAX_SEARCH_CALLS` module calls, in a DataLoader worker,
and when telemetry is off.

A root called while a phase is open on its thread is not timed again: evaluation stays "eval",
activation recomputation inside backward stays "backward", and DDP's own forward (timed in
`collectives`) or an integration's forward re-enters the same phase, which counts once.

Evaluation of a plain loop: a root that has trained (been called with gradients on, in training
mode) called again under `torch.no_grad()` / `torch.inference_mode()` or after `model.eval()` opens
the "eval" phase, which stays open across the pass (its batches, its loss, its all-reduce) until the
loop trains again: that root called with gradients on in training mode, a backward pass, an
optimizer step, or a DataLoader batch fetched with gradients on while that root is in training
mode or from a dataset whose batches were fetched for training before (`before_fetch`). A
DataLoader iterated outside every phase, once a root has trained, with gradients off or a trained
root in eval mode, from a dataset never fetched for training, opens the pass itself: the loader's
start-up and first batch, fetched before the model call, are the evaluation's. A module that never
trained (a frozen teacher, an encoder called under `no_grad`) stays "forward". The timer keeps eval
time out of the step that contains it.
"""
from __future__ import annotations

import threading
import weakref

from . import session

PHASE = "forward"
EVAL = "eval"
MAX_SEARCH_CALLS = 50_000     # module calls the global hook may see before it gives up (no steps at all)

_local = threading.local()    # .entered: per root call in flight on this thread, whether it entered the phase
_lock = threading.Lock()      # install / stop / adopt (never on the per-call path of a found root)
_global: list = []            # the global pre-hook's handle while the search runs
_roots: list = []             # (pre, post) handles of the roots' own hooks
_adopted: "weakref.WeakSet" = weakref.WeakSet()
_trained: "weakref.WeakSet" = weakref.WeakSet()   # roots called with gradients on, in training mode
# datasets whose batches were fetched as data_wait with gradients on: training data (id -> dataset)
_train_data: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def _pending():
    """`eval_root` of a pass opened by a batch fetch under no_grad: the first trained root called in it."""
    return None

# started: the search ran in this process; base / found_at: the timer's step boundaries at the search's
# first call / when the first root was found; calls: module calls seen
_search = {"started": False, "base": None, "found_at": None, "calls": 0}


def _grad_enabled() -> bool:
    return True


def _evaluating(module) -> bool:
    """True for a call of a root that has trained, made without gradients or in eval mode."""
    if _grad_enabled() and module.training:
        if module not in _trained:
            _trained.add(module)
        return False
    return module in _trained


def _begin(module, t) -> None:
    """Open "forward" (or a pass's "eval") for this call of root `module` unless a phase is open;
    note whether "forward" was entered (the post-hook pops one per call)."""
    entered = False
    try:
        if t is not None and not t.broken:
            current = t.current_phase()
            if current == EVAL and getattr(_local, "eval_root", None) is not None:
                if _local.eval_root is _pending and module in _trained:
                    _local.eval_root = weakref.ref(module)
                if _local.eval_root() is module and not _evaluating(module):
                    end_eval(t)   # the model trains again
                    current = t.current_phase()
            if current is None:
                if _evaluating(module):
                    t.enter(EVAL)
                    _local.eval_root = weakref.ref(module)
                else:
                    t.enter(PHASE)
                    entered = True
    finally:
        stack = getattr(_local, "entered", None)
        if stack is None:
            stack = _local.entered = []
        stack.append(entered)


def eval_open() -> bool:
    """True while this thread is in an evaluation pass that the model call opened."""
    return getattr(_local, "eval_root", None) is not None


def end_eval(t) -> None:
    """Close this thread's evaluation pass, if the model call opened one (training goes on)."""
    try:
        if getattr(_local, "eval_root", None) is None:
            return
        if t is None or t.broken:
            _local.eval_root = None
        elif t.current_phase() == EVAL:
            _local.eval_root = None
            t.exit(EVAL)
    except Exception as exc:  # never let our bug reach the training loop
        _local.eval_root = None
        session.log.warning("otel-gpu: end of evaluation not timed: %r", exc)


def training_resumes(t, dataset=None) -> None:
    """A batch is being fetched (from `dataset` when known): it ends the evaluation pass when gradients
    are on and the model that was evaluated is back in training mode, or the batch is training data
    (a loop that calls `model.train()` after its fetch)."""
    try:
        ref = getattr(_local, "eval_root", None)
        if ref is None or not _grad_enabled():
            return
        root = ref()
        if root is None or root.training or (dataset is not None and _train_data.get(id(dataset)) is dataset):
            end_eval(t)
    except Exception as exc:  # never let our bug reach the training loop
        session.log.warning("otel-gpu: end of evaluation not timed: %r", exc)


def before_fetch(t, dataset) -> None:
    """A DataLoader over `dataset` is about to make its iterator or fetch a batch on this thread: an open
    evaluation pass may end (`training_resumes`); with no phase open, once a root has trained, gradients
    off or a trained root in eval mode and `dataset` never fetched for training open one (its first
    batch and the loader's start-up are the evaluation's, not the step's)."""
    try:
        if getattr(_local, "eval_root", None) is not None:
            training_resumes(t, dataset)
            return
        if not _trained or t is None or t.broken or _train_data.get(id(dataset)) is dataset:
            return
        if t.current_phase() is not None:
            return
        root = next((m for m in _trained if not m.training), None)
        if root is None and _grad_enabled():
            return
        t.enter(EVAL)
        _local.eval_root = weakref.ref(root) if root is not None else _pending
    except Exception as exc:  # never let our bug reach the training loop
        session.log.warning("otel-gpu: start of evaluation not timed: %r", exc)


def training_data(dataset) -> None:
    """Batches of `dataset` are being fetched as data_wait: with gradients on, it is training data."""
    try:
        if _grad_enabled() and _train_data.get(id(dataset)) is not dataset:
            _train_data[id(dataset)] = dataset
    except TypeError:   # a dataset that cannot be weakly referenced: not remembered
        pass


def _root_pre(module, args):
    try:
        _begin(module, session.timer())
    except Exception as exc:  # never let our bug reach the training loop
        session.log.warning("otel-gpu: forward of the model not timed: %r", exc)
    return None


def _root_post(module, args, output):
    try:
        stack = getattr(_local, "entered", None)
        if stack and stack.pop():
            t = session.timer()
            if t is not None:
                t.exit(PHASE)
    except Exception as exc:  # never let our bug reach the training loop
        session.log.warning("otel-gpu: forward of the model not timed: %r", exc)
    return None


def _adopt(module, t) -> None:
    """Give `module` its own hooks and time this call of it (its own pre-hook was not in the list
    torch read for this call; its post-hook is read after forward, so it closes this call)."""
    with _lock:
        if module in _adopted:
            return
        pre = module.register_forward_pre_hook(_root_pre)
        try:
            post = module.register_forward_hook(_root_post, always_call=True)   # runs when forward raises
        except TypeError:   # torch < 2.0
            post = module.register_forward_hook(_root_post)
        _roots.append((pre, post))
        _adopted.add(module)
        session.model_seen(module)
        if _search["found_at"] is None:
            _search["found_at"] = t.boundaries
    _begin(module, t)


def _search_done(t) -> bool:
    found = _search["found_at"]
    _search["calls"] += 1
    if _search["base"] is None:
        _search["base"] = t.boundaries
    if _search["calls"] > MAX_SEARCH_CALLS:
        return True
    return t.boundaries - _search["base"] >= 2 if found is None else t.boundaries > found


def _global_pre(module, args):
    try:
        if _compiling():
            return None
        if _in_worker():
            _stop()
            return None
        t = session.timer()
        if t is None or t.broken or _search_done(t):
            _stop()
            return None
        if module in _adopted or t.current_phase() is not None:
            return None
        _adopt(module, t)
    except Exception as exc:  # never let our bug reach the training loop
        _stop()
        session.log.warning("otel-gpu: forward of the model not timed: %r", exc)
    return None


def _compiling() -> bool:
    return False


def _in_worker() -> bool:
    return False


def install() -> bool:
    """Start searching for the model (once per process); False when torch has no global module hooks."""
    global _compiling, _in_worker, _grad_enabled
    import torch
    from torch.nn.modules import module as nn_module
    from torch.utils.data import get_worker_info

    register = getattr(nn_module, "register_module_forward_pre_hook", None)
    if register is None:
        return False
    compiler = getattr(torch, "compiler", None)
    _compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
    _in_worker = lambda: get_worker_info() is not None   # noqa: E731
    _grad_enabled = torch.is_grad_enabled
    with _lock:
        if _search["started"]:
            return True
        _search["started"] = True
        _global.append(register(_global_pre))
    return True


def searching() -> bool:
    """True while the global hook is registered."""
    return bool(_global)


def _stop() -> None:
    with _lock:
        while _global:
            _global.pop().remove()


def uninstall() -> None:
    """Remove every hook and forget the roots (tests, benches)."""
    _stop()
    with _lock:
        while _roots:
            for handle in _roots.pop():
                handle.remove()
        _adopted.clear()
        _trained.clear()
        _train_data.clear()
        _search.update(started=False, base=None, found_at=None, calls=0)
    _local.__dict__.clear()
