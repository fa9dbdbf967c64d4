"""Zero code change: instrument torch, the HF Trainer, DeepSpeed and Lightning when imported.

`install()` is called from the `sitecustomize` that `otel-gpu run` puts on PYTHONPATH.
It only registers post-import hooks: no thread starts and nothing is exported until the
process actually trains (the first step or phase event), so launchers (torchrun, the
deepspeed runner) and DataLoader workers stay silent. When torch is imported, the modules
the session will load (the OTLP exporter, pyroscope-io) are imported too, so their cost is
paid with torch's import rather than in the program's first timed batch.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from typing import Callable

log = logging.getLogger("otel_gpu.training")


def _torch(module) -> None:
    from . import collectives, gpu_collectives, session, torch_hooks
    gpu_collectives.prepare_env(os.environ)   # before any NCCL process group exists
    torch_hooks.install()
    collectives.install()
    session.prepare()   # the exporter's imports now, not in the first batch the program times


def _transformers_trainer(module) -> None:
    from . import hf
    hf.patch_trainer_class(module)


def _deepspeed(module) -> None:
    from . import deepspeed
    deepspeed.patch_initialize(module)


def _lightning(module) -> None:
    from . import lightning
    lightning.patch_trainer_class(module)


# module name -> what to do right after it has been imported
HOOKS: dict[str, Callable] = {
    "torch": _torch,
    "transformers.trainer": _transformers_trainer,
    "deepspeed": _deepspeed,
    "lightning.pytorch": _lightning,
    "pytorch_lightning": _lightning,
}


def _run(name: str, module) -> None:
    try:
        HOOKS[name](module)
    except Exception as exc:  # a library version we do not know must not break the import
        log.warning("otel-gpu: could not instrument %s: %r", name, exc)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then our hook."""

    def __init__(self, inner, name: str):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        _run(self.name, module)

    def __getattr__(self, attr):   # get_resource_reader, is_package, ... of the real loader
        return getattr(self.inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._busy = threading.local()

    def find_spec(self, name, path=None, target=None):
        if name not in HOOKS or getattr(self._busy, "name", None) == name:
            return None
        self._busy.name = name
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, name)
        return spec


_finder = _Finder()


def install() -> None:
    """Register the hooks; modules imported already are instrumented at once."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    for name in HOOKS:
        module = sys.modules.get(name)
        if module is not None:
            _run(name, module)
