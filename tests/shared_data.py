"""Where the tests find the shared test material, and the skip that says how to get it.

The material: real PyTorch profiler traces, HTA 0.5.0's results on them, nvidia-smi captures, node_exporter
fixtures, DeepSpeed configs, a captured Pyroscope push; files taken byte-exact from public repositories
(its MANIFEST.csv names each file's source repository, path, commit and license) plus HTA's outputs made
from them. It is not in this repository: a checkout finds it at ../shared/data (beside the checkout), or
wherever OTELGPU_SHARED_DATA points. Without it the tests that read it skip, each saying so.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_DATA = Path(os.environ.get("OTELGPU_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
HINT = ("shared test material not found at {path} (not in this repository: see README, 'Tests'; "
        "../shared/data beside the checkout, or OTELGPU_SHARED_DATA=DIR)")


def shared_data(*parts: str) -> Path:
    """A path inside the shared test material (it may not exist: see `needs_shared_data`)."""
    return SHARED_DATA.joinpath(*parts)


def reason(*parts: str) -> str:
    """The skip reason of a test whose shared material is absent: where it was looked for, how to get it."""
    return HINT.format(path=shared_data(*parts))


def needs_shared_data(*parts: str):
    """A skipif mark: skip unless ``shared_data(*parts)`` exists, with `reason`."""
    return pytest.mark.skipif(not shared_data(*parts).exists(), reason=reason(*parts))


def require_shared_data(*parts: str) -> Path:
    """``shared_data(*parts)``, or skip the calling test with `reason`."""
    path = shared_data(*parts)
    if not path.exists():
        pytest.skip(reason(*parts))
    return path
