"""`opentelemetry-instrument python train.py` works too: an OpenTelemetry instrumentor
(entry point group `opentelemetry_instrumentor`, name `otel_gpu`) that installs the same
import hooks as `otel-gpu run` (see `auto`). Needs the `instrument` extra
(opentelemetry-instrumentation); `otel-gpu run` does not.
"""
from __future__ import annotations

from typing import Collection

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from . import auto


class OtelGpuInstrumentor(BaseInstrumentor):
    """Step, phase and checkpoint telemetry for torch, the HF Trainer, DeepSpeed and Lightning."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()   # each hook waits for its library to be imported; none is required

    def _instrument(self, **kwargs) -> None:
        auto.install()

    def _uninstrument(self, **kwargs) -> None:
        """Nothing to undo safely: patched classes keep their hooks until the process ends."""
