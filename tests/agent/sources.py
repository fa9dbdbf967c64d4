"""Small real Source implementations for agent tests (scripted values, failures as data)."""
from __future__ import annotations


from otel_gpu import names
from otel_gpu.readings import Reading, SourceError


class ScriptedSource:
    """Returns scripted utilization values, one per read; raises SourceError on `fail_on` reads."""

    def __init__(self, name="scripted", values=(0.5,), fail_on=(), hang=None):
        self.name = name
        self.partial_errors = 0
        self.values = list(values)
        self.fail_on = set(fail_on)
        self.reads = 0
        self.hang = hang  # a threading.Event the read blocks on

    def read(self):
        self.reads += 1
        if self.hang is not None:
            self.hang.wait()
        if self.reads in self.fail_on:
            raise SourceError(f"{self.name}: scripted failure on read {self.reads}")
        value = self.values[min(self.reads - 1, len(self.values) - 1)]
        gpu = {names.HW_ID: "GPU-test", names.HW_NAME: "Test GPU", names.HW_VENDOR: "nvidia",
               names.HW_TYPE: "gpu", names.GPU_INDEX: "0"}
        return [Reading(names.GPU_UTILIZATION, value, {**gpu, names.GPU_TASK: "general"}),
                Reading(names.GPU_ENERGY, 100.0 * self.reads, gpu)]


class SwitchSource(ScriptedSource):
    """Reports `before` until `flip()` is called, then `after`; `flip()` returns the time (monotonic s)."""

    def __init__(self, name="switch", before=0.2, after=0.9):
        super().__init__(name=name, values=[before])
        self.after = after

    def flip(self) -> float:
        import time
        self.values = [self.after]
        return time.monotonic()
