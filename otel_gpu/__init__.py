"""otel-gpu: observe, diagnose and improve distributed GPU training.

In a training loop: `with otel_gpu.step(): ...`, `with otel_gpu.phase("backward"): ...`,
`with otel_gpu.checkpoint(): ...` (see docs/training.md). They are imported on first use,
so `import otel_gpu` itself stays cheap.
"""
__version__ = "0.1.0"

_TRAINING = ("step", "phase", "checkpoint")


def __getattr__(name):
    if name in _TRAINING:
        from . import training
        return getattr(training, name)
    raise AttributeError(f"module 'otel_gpu' has no attribute {name!r}")
