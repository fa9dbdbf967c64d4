"""Put on PYTHONPATH by `otel-gpu run`: instrument this Python process, then run the
`sitecustomize` this one hides (Debian ships one), if any.

This runs while the interpreter starts: a Ctrl-C now (KeyboardInterrupt) would end it with
"Fatal Python error: init_import_site" and status 1. It ends the process as an uncaught
KeyboardInterrupt does, by SIGINT itself (status 130 in a shell), the job's own exit."""
import importlib.util
import os
import signal
import sys


def _otelgpu_boot():
    try:
        from otel_gpu.training import auto
        auto.install()
    except Exception as exc:  # a broken install must not stop the user's program
        print(f"otel-gpu: training telemetry not installed in this process: {exc!r}", file=sys.stderr)


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.modules.pop("sitecustomize", None)
    saved_path = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.origin and os.path.dirname(os.path.abspath(spec.origin)) != here:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except Exception as exc:
        print(f"otel-gpu: the original sitecustomize failed: {exc!r}", file=sys.stderr)
    finally:
        sys.path[:] = saved_path
        if saved is not None:
            sys.modules["sitecustomize"] = saved


def _interrupted():
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


try:
    _otelgpu_boot()
    _chain()
except KeyboardInterrupt:
    _interrupted()
