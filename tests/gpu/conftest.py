"""Fixtures for the GPU sources: the fake NVML, and the real `pynvml` where a GPU exists.

Tests parametrized over `backend` run once against `FakeNvml` and once (marked
`gpu`) against the real NVML; the real run skips, with the reason, where
`nvmlInit()` fails (no driver, no GPU).
"""
from __future__ import annotations

import pynvml
import pytest

from otel_gpu.sources.fake_nvml import fake_cluster_node


def _real_nvml():
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        pytest.skip(f"no NVIDIA driver/GPU on this machine: nvmlInit failed ({err})")
    pynvml.nvmlShutdown()
    return pynvml


@pytest.fixture
def real_nvml():
    """The real `pynvml` module, or a skip when NVML cannot start here."""
    return _real_nvml()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.gpu)])
def backend(request):
    """(kind, nvml module): an 8-GPU Hopper fake, or the real NVML."""
    if request.param == "real":
        return "real", _real_nvml()
    return "fake", fake_cluster_node(8, "hopper")


def select(readings, name, **attrs):
    """Readings of metric `name` whose attributes include `attrs` (keys with '.' as '__')."""
    want = {k.replace("__", "."): v for k, v in attrs.items()}
    return [r for r in readings if r.spec.name == name and all(r.attributes.get(k) == v for k, v in want.items())]


def by_gpu(readings, name, **attrs):
    """{hw.id: value} for metric `name` (one reading per GPU expected)."""
    out = {}
    for r in select(readings, name, **attrs):
        assert r.attributes["hw.id"] not in out, f"two {name} readings for {r.attributes['hw.id']}"
        out[r.attributes["hw.id"]] = r.value
    return out


class StepClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t
