"""GPU health readings operators page on, read with the rarely changing fields (every 10 s, like the
ECC totals): row remapping (rows remapped, a remap pending or failed), retired pages (pre-Ampere
GPUs; newer ones answer NOT_SUPPORTED), NVLink error counters per link (replay, recovery, CRC flit,
CRC data), the PCIe replay counter, and the PCIe link's current and maximum generation and width.

Each group is one field of the device (nvml_device.call): NOT_SUPPORTED is remembered and the group
left out (never 0). An NVLink link that answers NOT_SUPPORTED or INVALID_ARGUMENT (not trained, or
beyond the GPU's links) is skipped from then on. Used by `NvmlSource._slow` (nvml.py).
"""
from __future__ import annotations

from typing import Callable

import pynvml

from .. import names as N
from ..readings import Reading
from . import nvml_errors as E
from .nvml_cadence import timed
from .nvml_device import SKIP, Device, DeviceLost

NVLINK_COUNTERS = (("replay", "NVML_NVLINK_ERROR_DL_REPLAY"), ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
                   ("crc_flit", "NVML_NVLINK_ERROR_DL_CRC_FLIT"), ("crc_data", "NVML_NVLINK_ERROR_DL_CRC_DATA"))
RETIRED = (("single_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
           ("double_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"))
PCIE_LINK = ((N.GPU_PCIE_LINK_GENERATION, "nvmlDeviceGetCurrPcieLinkGeneration"),
             (N.GPU_PCIE_LINK_GENERATION_MAX, "nvmlDeviceGetMaxPcieLinkGeneration"),
             (N.GPU_PCIE_LINK_WIDTH, "nvmlDeviceGetCurrPcieLinkWidth"),
             (N.GPU_PCIE_LINK_WIDTH_MAX, "nvmlDeviceGetMaxPcieLinkWidth"))
FIELDS = ("row_remap", "retired_pages", "nvlink_errors", "pcie_replay", "pcie_link")


def health_readings(nvml, call: Callable, dev: Device, links: int, on_error: Callable[[], None]) -> list[Reading]:
    """Every health reading of `dev` (a whole GPU); `links` is its NVLink count (0: none); `on_error()`
    counts a failing NVLink read (the other groups count theirs through `call`)."""
    out: list[Reading] = []
    h = dev.handle
    rows = call(dev, "row_remap", "nvmlDeviceGetRemappedRows", h)
    if rows is not SKIP:
        corrected, uncorrected, pending, failed = rows
        out += [Reading(N.GPU_REMAPPED_ROWS, float(corrected), dev.tagged(N.ERROR_TYPE, "correctable")),
                Reading(N.GPU_REMAPPED_ROWS, float(uncorrected), dev.tagged(N.ERROR_TYPE, "uncorrectable")),
                Reading(N.GPU_ROW_REMAP_PENDING, float(bool(pending)), dev.attrs),
                Reading(N.GPU_ROW_REMAP_FAILED, float(bool(failed)), dev.attrs)]
    for cause, const in RETIRED:
        pages = call(dev, "retired_pages", "nvmlDeviceGetRetiredPages", h, getattr(nvml, const))
        if pages is SKIP:
            break
        out.append(Reading(N.GPU_RETIRED_PAGES, float(len(pages)), dev.tagged(N.ERROR_TYPE, cause)))
    replays = call(dev, "pcie_replay", "nvmlDeviceGetPcieReplayCounter", h)
    if replays is not SKIP:
        out.append(Reading(N.GPU_PCIE_REPLAYS, float(replays), dev.attrs))
    for spec, fn in PCIE_LINK:
        value = call(dev, "pcie_link", fn, h)
        if value is SKIP:
            break
        out.append(Reading(spec, float(value), dev.attrs))
    if links and "nvlink_errors" not in dev.unsupported:
        out += _nvlink_errors(nvml, dev, links, on_error)
    return out


def _nvlink_errors(nvml, dev: Device, links: int, on_error: Callable[[], None]) -> list[Reading]:
    """All links' totals per counter, and each link's counters where any is above 0 (cumulative). Links
    that cannot answer are remembered in `dev.dead_links`; when a link's read fails now, this read's
    totals are left out (a total without that link would dip)."""
    fn = getattr(nvml, "nvmlDeviceGetNvLinkErrorCounter", None)
    if fn is None:
        dev.unsupported["nvlink_errors"] = "nvmlDeviceGetNvLinkErrorCounter not in this NVML binding"
        return []
    dead = dev.dead_links
    out, totals, read, failed = [], dict.fromkeys((c for c, _ in NVLINK_COUNTERS), 0.0), False, False
    for link in range(links):
        if link in dead:
            continue
        counts = []
        for counter, const in NVLINK_COUNTERS:
            try:
                n = timed(dev.costs, "nvlink_errors", "nvmlDeviceGetNvLinkErrorCounter", fn, dev.handle, link,
                          getattr(nvml, const))
            except pynvml.NVMLError as err:
                kind = E.classify(err)
                if kind == E.LOST:
                    raise DeviceLost(E.describe_error(err)) from None
                if kind == E.UNSUPPORTED:
                    dead.add(link)
                else:
                    dev.errors["nvlink_errors"] = E.describe_error(err)
                    on_error()
                    failed = True
                break
            counts.append((counter, float(n)))
        else:
            read = True
            for counter, n in counts:
                totals[counter] += n
            if any(n for _, n in counts):   # per link only where there are errors: 4 x 18 series a GPU otherwise
                out += [Reading(N.GPU_NVLINK_LINK_ERRORS, n, dev.link_attrs(link, c)) for c, n in counts]
    if links and len(dead) == links:
        dev.unsupported["nvlink_errors"] = f"no link answers ({links} links)"
    if read and not failed:
        out += [Reading(N.GPU_NVLINK_ERRORS, n, dev.tagged(N.ERROR_TYPE, c)) for c, n in totals.items()]
    return out
