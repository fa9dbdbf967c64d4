"""Build stub_nvml.c (beside this file) as `<folder>/libnvidia-ml.so.1`, for the benchmarks and the
tests that load the real pynvml on it."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "stub_nvml.c"


class NoCompiler(RuntimeError):
    """No gcc on PATH to build the stand-in."""


def build(folder: Path) -> Path:
    """The compiled library's path (`folder` is created); NoCompiler without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise NoCompiler("no C compiler (gcc) here to build the libnvidia-ml stand-in")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "libnvidia-ml.so.1"
    subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE), "-lm"], check=True)
    return out
