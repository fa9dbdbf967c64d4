"""One GPU's `nvmlGpmMetricsGet` request: metric ids written once, results read in one unpack.

pynvml's structures route every attribute access through a Python `__getattribute__` (~0.8 us),
and a request of 8 metrics took ~40 of them a round per GPU (setting the ids, reading return
codes and values). Here the ids are written only when the metric set changes (and again if NVML
ever changed them), and the results are read straight from the structure's memory with one
`struct` unpack laid out from pynvml's own field offsets. A request that is not a ctypes structure
(the fake's) is read attribute by attribute.
"""
from __future__ import annotations

import ctypes
import struct


def results_layout(request_type) -> tuple[int, int, str] | None:
    """(offset of the metrics array, size of one metric, struct codes of metricId, nvmlReturn,
    value) when `request_type` is a ctypes structure laid out as NVML's (id and return code
    4-byte integers at 0 and 4, the value a double at 8); None otherwise."""
    if not (isinstance(request_type, type) and issubclass(request_type, ctypes.Structure)):
        return None
    fields = dict(request_type._fields_)
    metric = getattr(fields.get("metrics"), "_type_", None)
    if metric is None or not issubclass(metric, ctypes.Structure):
        return None
    types = dict(metric._fields_)
    codes = []
    for name, offset, size in (("metricId", 0, 4), ("nvmlReturn", 4, 4), ("value", 8, 8)):
        field = getattr(metric, name, None)
        code = getattr(types.get(name), "_type_", None)
        if field is None or (field.offset, field.size) != (offset, size) or code not in ("I", "i", "d"):
            return None
        codes.append(code)
    return request_type.metrics.offset, ctypes.sizeof(metric), "".join(codes)


class MetricsRequest:
    """A reusable request for one GPU; `run` computes the metrics between two samples."""

    def __init__(self, nvml):
        self._nvml = nvml
        self.request = nvml.c_nvmlGpmMetricsGet_t()
        self._layout = results_layout(type(self.request))
        self._ids: tuple[int, ...] = ()
        self._unpack: struct.Struct | None = None

    def run(self, ids: tuple[int, ...], sample1, sample2) -> list[tuple[int, int, float]]:
        """(metric id, NVML return code, value) per requested metric, in order, computed between the
        samples (the ids as the request holds them after the call)."""
        nvml, req = self._nvml, self.request
        if ids != self._ids:
            self._fill(ids)
        req.version = nvml.NVML_GPM_METRICS_GET_VERSION   # every call, as before: NVML may write
        req.numMetrics = len(ids)                          # to its own request (the ids are checked)
        req.sample1 = sample1
        req.sample2 = sample2
        nvml.nvmlGpmMetricsGet(req)
        if self._unpack is None:
            return [(m.metricId, m.nvmlReturn, m.value) for m in req.metrics[:len(ids)]]
        flat = self._unpack.unpack_from(req, self._layout[0])
        if flat[0::3] != ids:
            self._ids = ()     # NVML rewrote ids it was given: write them all again next time
        return list(zip(flat[0::3], flat[1::3], flat[2::3]))

    def _fill(self, ids: tuple[int, ...]) -> None:
        metrics = self.request.metrics
        for k, mid in enumerate(ids):
            metrics[k].metricId = mid
        self._ids = ids
        if self._layout is not None:
            _, size, codes = self._layout
            record = codes + f"{size - 16}x" if size > 16 else codes
            self._unpack = struct.Struct("=" + record * len(ids))
