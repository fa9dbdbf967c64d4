"""Fixtures for the GPU sources: the fake NVML, and the real `pynvml` where a GPU exists.

Tests parametrized over `backend` run once against `FakeNvml`, once against the real `pynvml`
bound to a C stand-in for libnvidia-ml (bench/nvml_stub: pynvml's own ctypes wrappers and
structures, which `FakeNvml` replaces, on CPU machines) and once (marked `gpu`) against the real
NVML; the real run skips, with the reason, where `nvmlInit()` fails (no driver, no GPU).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import pynvml
import pytest

from bench.nvml_stub.build import NoCompiler, build
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


STUB_GPUS = 4


@pytest.fixture(scope="session")
def stub_library(tmp_path_factory) -> Path:
    """bench/nvml_stub/stub_nvml.c built as a libnvidia-ml.so.1 (a skip, with the reason, without gcc)."""
    try:
        return build(tmp_path_factory.mktemp("nvml-stub"))
    except NoCompiler as err:
        pytest.skip(str(err))


@pytest.fixture
def stub_pynvml(stub_library, monkeypatch):
    """The real `pynvml`, its library swapped for the stand-in (STUB_GPUS GPUs) for one test."""
    monkeypatch.setenv("STUB_NVML_GPUS", str(STUB_GPUS))
    saved = pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache)
    pynvml.nvmlLib = ctypes.CDLL(str(stub_library))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield pynvml
    finally:
        pynvml.nvmlLib = saved[0]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[1])


@pytest.fixture(params=["fake", "stub", pytest.param("real", marks=pytest.mark.gpu)])
def backend(request):
    """(kind, nvml module): an 8-GPU Hopper fake, pynvml on the C stand-in, or the real NVML."""
    if request.param == "real":
        return "real", _real_nvml()
    if request.param == "stub":
        return "stub", request.getfixturevalue("stub_pynvml")
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
