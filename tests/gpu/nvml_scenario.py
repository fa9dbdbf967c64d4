"""A fixed sequence of reads of `NvmlSource` over `FakeNvml`s on a scripted clock, as text.

`tests/gpu/data/nvml_golden.txt` holds the SHA-256 of each case's text as the tree before the
NVML source and the fake were made cheaper read them; `test_nvml_golden.py` compares. Every
value the fake answers reaches the text (through the source's readings, `describe()` and the
fake's call counts), so both the source's readings and the fake's outputs stay byte-identical.
Regenerate (only when values are meant to change) or print a case's text to diff two checkouts:

    python tests/gpu/nvml_scenario.py > tests/gpu/data/nvml_golden.txt
    python tests/gpu/nvml_scenario.py --full CASE
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile

STEPS = (0.0, 0.1, 0.1, 0.37, 1.0, 1.0, 0.05, 2.5, 1.0, 0.2, 0.2, 7.9, 1.0, 30.5, 1.0, 0.1, 0.1, 1.0)


def _cases():
    from otel_gpu.sources.fake_nvml import H100_MIG, FakeMig, FakeProcess, a100, h200, hopper

    procs = (FakeProcess(4242, 3 * 2**30), FakeProcess(77, 5 * 2**20))
    return {
        "hopper8": dict(gpus=[hopper(processes=procs if i == 2 else (), load=0.1 * i,
                                     stall=(4.0, 1.5) if i == 3 else None) for i in range(8)]),
        "flaky": dict(gpus=[hopper(not_supported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature"}),
                            hopper(missing_functions={"nvmlDeviceGetCurrentClocksEventReasons"}, xids=(13, 79, 13)),
                            hopper(lost_after_reads=4), a100(pcie_kbps=(3000, 7000)), h200(clock_event_reasons=0x24),
                            hopper(ecc_errors=(3, 1), nvlinks=0, load=0.0)]),
        "mig": dict(gpus=[hopper(mig_devices=H100_MIG, processes=procs), hopper()], mig_change=True,
                    new_migs=(FakeMig("1g.10gb", 9984 * 2**20, 20 * 2**20),)),
    }


def run_case(name: str) -> str:
    """The text of every read of case `name` (readings, then describe() and the call counts)."""
    from otel_gpu.sources.fake_nvml import FakeNvml
    from otel_gpu.sources.nvml import NvmlSource

    case = _cases()[name]
    t = [1000.0]
    clock = lambda: t[0]   # noqa: E731
    fake = FakeNvml(gpus=case["gpus"], clock=clock, costs={})
    lines = []
    with tempfile.TemporaryDirectory() as proc_root:
        for pid in (4242, 77):   # the fake's processes exist here (PIDs not in /proc are dropped)
            os.mkdir(os.path.join(proc_root, str(pid)))
        src = NvmlSource(nvml=fake, clock=clock, proc_root=proc_root, cadence=False)
        for k, step in enumerate(STEPS):
            t[0] += step
            if case.get("mig_change") and k == 9:
                fake.set_mig_devices(0, 2, case["new_migs"])
            if k == 5:
                fake.inject_xid(1, 31)
            lines.append(f"read {k} t={t[0]!r}")
            for r in src.read():
                lines.append(f"{r.spec.name} {list(r.attributes.items())} {r.value!r} {type(r.value).__name__}")
        desc = src.describe()
        desc.pop("field_costs")   # measured times: not a function of the script
        lines.append(repr(desc))
        lines.append(repr(sorted(fake.calls.items(), key=repr)))
        src.close()
    return "\n".join(lines) + "\n"


def digests() -> list[str]:
    """`case sha256` per case (every field read every round: the background cadence's choices
    rest on measured call times, which no script fixes)."""
    return [f"{name} {hashlib.sha256(run_case(name).encode()).hexdigest()}" for name in _cases()]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--full":
        sys.stdout.write(run_case(sys.argv[2]))
    else:
        print("\n".join(digests()))
