"""`otel-gpu doctor`'s NVML cost table: the per-call cost is the steady one (the median of calls after the first),
the first call, which carries NVML's one-time set-up, is shown apart."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from otel_gpu.sources.fake_nvml import FakeCost, FakeNvml, hopper
from otel_gpu.sources.nvml import NvmlSource

REPO = Path(__file__).resolve().parents[2]
SETUP_S = 0.03   # s asleep in each function's first call on a GPU (the fake's one-time set-up)


def _rows(costs: dict[str, FakeCost]) -> dict[str, dict]:
    src = NvmlSource(nvml=FakeNvml(gpus=[hopper()] * 2, costs=costs), background=True)
    try:
        src.time_calls()   # as `otel-gpu doctor` does before describing
        return {r["field"]: r for r in src.describe()["field_costs"]}
    finally:
        src.close()


def test_the_per_call_cost_leaves_the_first_calls_set_up_out():
    rows = _rows({"nvmlDeviceGetPowerUsage": FakeCost(first_sleep_s=SETUP_S),
                  "nvmlDeviceGetTotalEnergyConsumption": FakeCost(cpu_s=1e-3, first_sleep_s=SETUP_S)})
    power, energy, util = rows["power"], rows["energy"], rows["utilization"]
    assert power["wall_ms"] < 5 and power["cpu_ms"] < 1, power            # ~µs a call once set up
    assert 0.9 <= energy["cpu_ms"] and energy["wall_ms"] < SETUP_S * 1e3, energy
    assert power["first_ms"] >= SETUP_S * 1e3 and energy["first_ms"] >= SETUP_S * 1e3, (power, energy)
    assert util["wall_ms"] < 5 and util["first_ms"] < 5, util         # no set-up scripted: both small


def test_a_call_made_once_shows_no_per_call_cost():
    """GPM samples are not repeated for the table (each one is an interval of GPM's own): after one read only the
    first call is known, and the per-call columns say so ('-') rather than show it."""
    gpm = _rows({})["gpm"]
    assert gpm["first_ms"] is not None and gpm["wall_ms"] is None and gpm["cpu_ms"] is None, gpm



def test_the_doctor_command_shows_per_call_costs():
    """Through the command: every getter read in the probe has a per-call cost beside its first call's."""
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "doctor", "--json", "--fake-gpus", "1"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    rows = {r["field"]: r for r in json.loads(out.stdout)["sources"]["nvml"]["field_costs"]}
    for field in ("utilization", "power", "energy", "pcie_transmit", "processes"):
        assert rows[field]["wall_ms"] is not None and rows[field]["first_ms"] is not None, rows[field]
    assert rows["energy"]["cpu_ms"] >= 3.5 and rows["pcie_transmit"]["wall_ms"] >= 20   # the fake's H100 costs


def test_getters_are_timed_again_through_each_backend(backend):
    """The same table from the fake, from pynvml on the C stand-in and (marked `gpu`) from real NVML: each getter
    the probe called has a per-call cost and a first call, and timing them again counts no error."""
    kind, nvml = backend
    src = NvmlSource(nvml=nvml)
    try:
        src.time_calls()
        desc = src.describe()
    finally:
        src.close()
    rows = {r["field"]: r for r in desc["field_costs"]}
    for field in ("utilization", "memory", "power", "temperature", "processes"):
        if rows[field]["read"] != "unsupported":
            assert rows[field]["wall_ms"] is not None and rows[field]["first_ms"] is not None, (kind, rows[field])
    assert src.partial_errors == 0, (kind, desc["gpus"][0]["errors"])
