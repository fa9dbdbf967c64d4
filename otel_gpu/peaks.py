"""The GPUs' dense peak arithmetic rates, per product and compute dtype (pure data and lookups).

Keyed by the product name NVML reports (`nvmlDeviceGetName`, as nvidia-smi shows it). Every figure
is DENSE TFLOP/s (NVIDIA's datasheets print tensor-core rates "with sparsity": those are halved
here), at the boost clock, per GPU, from the source named on its row. `fp32` is the non-tensor
FP32 rate; `tf32`, `bf16`, `fp16` and `fp8` are tensor-core rates. A dtype a GPU has no tensor
cores for (bf16 and tf32 on V100, fp8 before Hopper/Ada) is absent: MFU there is "not checked".

A MIG device ("NVIDIA H100 80GB HBM3 MIG 3g.40gb") gets its GPU's peak times its share of the SMs,
`g` of the GPU's compute slices (3g: 3 of 7), as NVIDIA's MIG user guide states each profile's
"fraction of SMs" (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
TERA = 1e12
MAX_NAME = 96   # longest product name echoed in a "not checked" line (names are device data)
FP8_NOT_CHECKED = "not checked: no MFU under FP8 (scaling recipes differ; as torchtitan)"


@dataclass(frozen=True)
class Product:
    """One GPU product: dense TFLOP/s per dtype, MIG compute slices (0: no MIG), the source."""
    name: str
    tflops: Mapping[str, float]
    source: str
    slices: int = 0


def _rates(fp32: float, tf32: float | None, bf16: float | None, fp16: float, fp8: float | None = None) -> dict:
    out = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "fp8": fp8}
    return {k: v for k, v in out.items() if v is not None}


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_HOPPER_WP = ("NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 PCIe column), "
              "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper")
_H200_DS = "NVIDIA H200 Tensor Core GPU specifications, https://www.nvidia.com/en-us/data-center/h200/"
_GH200_DS = "NVIDIA GH200 Grace Hopper Superchip specifications, https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/"
_A100_DS = ("NVIDIA A100 Tensor Core GPU datasheet, "
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_L40S_DS = "NVIDIA L40S GPU datasheet, https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
_L4_DS = "NVIDIA L4 Tensor Core GPU datasheet, https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
_A10_DS = ("NVIDIA A10 Tensor Core GPU datasheet, "
           "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf")
_V100_DS = ("NVIDIA Tesla V100 GPU datasheet, "
            "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")
_B200_DS = "NVIDIA HGX B200 specifications (8 GPUs; per GPU here), https://www.nvidia.com/en-us/data-center/hgx/"
_GB200_DS = "NVIDIA GB200 NVL72 specifications (72 GPUs; per GPU here), https://www.nvidia.com/en-us/data-center/gb200-nvl72/"

# Hopper SXM: datasheet 67 FP32, 989 TF32* / 1979 BF16,FP16* / 3958 FP8* (*with sparsity)
_HOPPER_SXM = _rates(67.0, 494.5, 989.5, 989.5, 1979.0)
# Hopper NVL (PCIe form, NVLink bridge): 60 FP32, 835 TF32* / 1671 BF16,FP16* / 3341 FP8*
_HOPPER_NVL = _rates(60.0, 417.5, 835.5, 835.5, 1670.5)
# A100 (SXM4 and PCIe alike): 19.5 FP32, 156 TF32 (312*), 312 BF16,FP16 (624*); no FP8
_A100 = _rates(19.5, 156.0, 312.0, 312.0)

PRODUCTS = (
    Product("NVIDIA H100 80GB HBM3", _HOPPER_SXM, _H100_DS + " (H100 SXM)", 7),
    Product("NVIDIA H100 NVL", _HOPPER_NVL, _H100_DS + " (H100 NVL)", 7),
    # 51 FP32, 756 TF32* / 1513 BF16,FP16* / 3026 FP8*
    Product("NVIDIA H100 PCIe", _rates(51.0, 378.0, 756.5, 756.5, 1513.0), _HOPPER_WP, 7),
    Product("NVIDIA H200", _HOPPER_SXM, _H200_DS + " (H200 SXM)", 7),
    Product("NVIDIA H200 NVL", _HOPPER_NVL, _H200_DS + " (H200 NVL)", 7),
    Product("NVIDIA GH200 480GB", _HOPPER_SXM, _GH200_DS, 7),
    Product("NVIDIA A100-SXM4-80GB", _A100, _A100_DS + " (A100 80GB SXM)", 7),
    Product("NVIDIA A100-SXM4-40GB", _A100, _A100_DS + " (A100 40GB SXM)", 7),
    Product("NVIDIA A100-PCIE-40GB", _A100, _A100_DS + " (A100 40GB PCIe)", 7),
    Product("NVIDIA A100 80GB PCIe", _A100, _A100_DS + " (A100 80GB PCIe)", 7),
    # 91.6 FP32, 366 TF32* / 733 BF16,FP16* / 1466 FP8*
    Product("NVIDIA L40S", _rates(91.6, 183.0, 362.05, 362.05, 733.0), _L40S_DS),
    # 30.3 FP32, 120 TF32* / 242 BF16,FP16* / 485 FP8*
    Product("NVIDIA L4", _rates(30.3, 60.0, 121.0, 121.0, 242.5), _L4_DS),
    # 31.2 FP32, 62.5 TF32 (125*), 125 BF16,FP16 (250*); no FP8
    Product("NVIDIA A10", _rates(31.2, 62.5, 125.0, 125.0), _A10_DS),
    # Volta: FP16 tensor cores only (no TF32, BF16 or FP8)
    Product("Tesla V100-SXM2-16GB", _rates(15.7, None, None, 125.0), _V100_DS + " (V100 SXM2)"),
    Product("Tesla V100-SXM2-32GB", _rates(15.7, None, None, 125.0), _V100_DS + " (V100 SXM2)"),
    Product("Tesla V100-PCIE-16GB", _rates(14.0, None, None, 112.0), _V100_DS + " (V100 PCIe)"),
    Product("Tesla V100-PCIE-32GB", _rates(14.0, None, None, 112.0), _V100_DS + " (V100 PCIe)"),
    Product("Tesla V100S-PCIE-32GB", _rates(16.4, None, None, 130.0), _V100_DS + " (V100S PCIe)"),
    # HGX B200, 8 GPUs: 600 TF FP32, 18 PF TF32* / 36 PF BF16,FP16* / 72 PF FP8*
    Product("NVIDIA B200", _rates(75.0, 1125.0, 2250.0, 2250.0, 4500.0), _B200_DS, 7),
    # GB200 NVL72, 72 GPUs: 5760 TF FP32, 180 PF TF32* / 360 PF BF16,FP16* / 720 PF FP8*
    Product("NVIDIA GB200", _rates(80.0, 1250.0, 2500.0, 2500.0, 5000.0), _GB200_DS, 7),
)


def normalise(name: str) -> str:
    """A product name compared without case or repeated spaces."""
    return " ".join(str(name).split()).casefold()


_BY_NAME = {normalise(p.name): p for p in PRODUCTS}
_MIG = re.compile(r"^(?P<base>.*?)\s+MIG\s+(?P<profile>\S+)$", re.IGNORECASE)
_PROFILE = re.compile(r"^(?:[0-9]+c\.)?(?P<g>[0-9]+)g\.[0-9]+gb(?:\+[a-z]+)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Peak:
    """A device's dense peaks (FLOP/s per dtype) and what they rest on; `why_not` set when unknown."""
    device: str
    flops: Mapping[str, float]
    basis: str = ""
    why_not: str = ""

    def rate(self, dtype: str) -> tuple[float | None, str]:
        """(FLOP/s, "") for `dtype`, or (None, "not checked: why")."""
        if self.why_not:
            return None, self.why_not
        if dtype == "fp8":
            return None, FP8_NOT_CHECKED
        value = self.flops.get(dtype)
        if value is None:
            return None, f"not checked: {self.device} has no {dtype} peak (no {dtype} tensor cores)"
        return value, ""


def mig_share(profile: str, slices: int) -> float | None:
    """The share of a GPU's SMs a MIG profile has: '3g.40gb' on a 7-slice GPU -> 3/7 (None: not a profile)."""
    m = _PROFILE.match(profile.strip())
    if m is None or slices <= 0:
        return None
    g = int(m.group("g"))
    return g / slices if 0 < g <= slices else None


def shown(name: str) -> str:
    """A device name as it may appear in a message: printable, bounded."""
    text = "".join(c if c.isprintable() else "?" for c in str(name))
    return text if len(text) <= MAX_NAME else text[:MAX_NAME - 3] + "..."


@lru_cache(maxsize=256)
def peak_of(name: str) -> Peak:
    """The dense peaks of the device NVML names `name` (a MIG device scaled by its SM share)."""
    product = _BY_NAME.get(normalise(name))
    if product is not None:
        return Peak(product.name, {k: v * TERA for k, v in product.tflops.items()}, f"dense peak, {product.source}")
    m = _MIG.match(" ".join(str(name).split()))
    if m is not None:
        product = _BY_NAME.get(normalise(m.group("base")))
        if product is not None:
            share = mig_share(m.group("profile"), product.slices)
            if share is None:
                return Peak(shown(name), {}, why_not=f"not checked: MIG profile {shown(m.group('profile'))} "
                                                      f"of {product.name} not understood")
            g = int(_PROFILE.match(m.group("profile")).group("g"))
            return Peak(shown(name), {k: v * TERA * share for k, v in product.tflops.items()},
                        f"dense peak x {g}/{product.slices} (MIG {m.group('profile')}: its share of the SMs), "
                        f"{product.source}")
    return Peak(shown(name), {}, why_not=f"not checked: {shown(name)} not in the peak table")


def peak_rate(name: str, dtype: str) -> tuple[float | None, str]:
    """(dense peak FLOP/s of device `name` in `dtype`, "") or (None, "not checked: why")."""
    return peak_of(name).rate(dtype)
