"""What a GEMM or convolution kernel's name says about how it runs on the tensor cores.

cuBLAS, cuBLASLt, CUTLASS and cuDNN name their kernels after the architecture they were built for
(``sm90_xmma_gemm_...``, ``cutlass_80_tensorop_...``, ``ampere_...``), the element type
(``bf16``, ``f16``, ``tf32``, ``sgemm`` for fp32 without tensor cores) and, for CUTLASS-style
kernels, the alignment of the operands in elements (``_align1``, ``_align8``; cuBLAS's older names
``ldg8``). A 16-bit GEMM reaches full tensor-core speed only with 16-byte aligned operands: leading
dimensions that are multiples of 8 elements (4 for fp32/tf32, 16 for 8-bit types). A misaligned
dimension makes the library fall back to ``align1``/``align2`` kernels, on Hopper often to Ampere
(sm80) kernels without TMA/wgmma.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .fold_case import FoldedPattern, folded

GEMM_RE = FoldedPattern(r"(?<!fb)gemm|xmma|cutlass|wgmma|nvjet|gemv|implicit_convolve|convolve_|winograd|dgrad"
                        r"|wgrad|fprop|conv[123]d|cudnn")
_ARCH_RE = FoldedPattern(r"(?:^|[^a-z0-9])(?:sm_?|cutlass_)(\d{2,3})(?=[_a-z])")
_ARCH_NAMES = {"maxwell": 52, "pascal": 60, "volta": 70, "turing": 75, "ampere": 80, "ada": 89, "hopper": 90,
               "blackwell": 100}
_NAMED_ARCH_RE = FoldedPattern(r"(?:^|[^a-z])(" + "|".join(_ARCH_NAMES) + r")_")
_ALIGN_RE = FoldedPattern(r"(?:_|^)(?:align|ldg)(\d+)(?![0-9])")
_BYTES_2 = FoldedPattern(r"bf16|bfloat16|f16|fp16|half|h1688|h16816|h884|hgemm|_hs[hs]_|nvjet_h")
_BYTES_1 = FoldedPattern(r"e4m3|e5m2|fp8|f8f8|i8|int8|imma")
_BYTES_4 = FoldedPattern(r"sgemm|tf32|s1688gemm|s884gemm|f32|float")
_FP32_SIMT_RE = FoldedPattern(r"sgemm|gemmSN\w*<float|gemv\w*<float|gemmk1\w*<float")
PATTERNS = (GEMM_RE, _ARCH_RE, _NAMED_ARCH_RE, _ALIGN_RE, _BYTES_2, _BYTES_1, _BYTES_4, _FP32_SIMT_RE)  # (tests)
ALIGN_BYTES = 16  # a vectorised tensor-core load


@dataclass(frozen=True)
class GemmKernel:
    """What one kernel name tells: is it a GEMM/conv, its architecture (e.g. 80, None when the name
    does not say), element size in bytes (None when unknown), alignment in elements (None when the
    name does not say), and whether it is fp32 math without tensor cores."""

    gemm: bool
    arch: int | None
    elem_bytes: int | None
    align: int | None
    fp32_simt: bool

    @property
    def misaligned(self) -> bool:
        """Operands narrower than a 16-byte load (``align1`` always; ``align2``/``align4`` for 16-bit types)."""
        return self.gemm and self.align is not None and self.align * (self.elem_bytes or 2) < ALIGN_BYTES

    @property
    def low_precision(self) -> bool:
        return self.gemm and self.elem_bytes in (1, 2)


@lru_cache(maxsize=1 << 14)
def classify(name: str) -> GemmKernel:
    """A kernel name's GEMM properties (see :class:`GemmKernel`)."""
    low = folded(name)
    if not GEMM_RE.search(name, low):
        return GemmKernel(False, None, None, None, False)
    m = _ARCH_RE.search(name, low)
    arch = int(m.group(1)) if m else None
    if arch is None and (m := _NAMED_ARCH_RE.search(name, low)):
        arch = _ARCH_NAMES[m.group(1).lower()]
    elem = 2 if _BYTES_2.search(name, low) else 1 if _BYTES_1.search(name, low) else 4 if _BYTES_4.search(
        name, low) else None
    aligns = [int(x) for x in _ALIGN_RE.findall(name, low)]
    return GemmKernel(True, arch, elem, min(aligns) if aligns else None, bool(_FP32_SIMT_RE.search(name, low)))


def device_arch(meta: dict) -> tuple[int | None, str]:
    """(compute capability as major*10+minor, device name) of the trace's first CUDA device, from
    Kineto's ``deviceProperties``; (None, "") when the trace does not say or the device is not NVIDIA."""
    props = meta.get("deviceProperties") if isinstance(meta, dict) else None
    if not isinstance(props, list) or not props or not isinstance(props[0], dict):
        return None, ""
    p = props[0]
    name = str(p.get("name", ""))
    major, minor = p.get("computeMajor"), p.get("computeMinor", 0)
    if "AMD" in name.upper() or type(major) is not int or type(minor) is not int:
        return None, name
    return major * 10 + minor, name


def older_arch(kernel: GemmKernel, device: int | None) -> bool:
    """A GEMM kernel built for an older major architecture than the device it ran on (sm80 on sm90)."""
    return kernel.gemm and device is not None and kernel.arch is not None and kernel.arch // 10 < device // 10


def misaligned_dims(dims: list, types: list | None) -> list[int]:
    """Dimensions of a GEMM op's inputs (the last two of each) that break 16-byte alignment for
    their element type: not a multiple of 8 for 16-bit types, 4 for 32-bit, 16 for 8-bit."""
    out: list[int] = []
    for i, d in enumerate(dims if isinstance(dims, list) else []):
        if not isinstance(d, list) or not d or not all(type(x) is int for x in d):
            continue
        t = str(types[i]) if isinstance(types, list) and i < len(types) else ""
        size = 1 if re.search(r"Float8|Byte|Char", t) else 4 if t.strip() == "float" else 2
        need = ALIGN_BYTES // size
        out += [x for x in d[-2:] if x % need and x not in out]
    return out
