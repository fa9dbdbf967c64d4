"""The GPM request's one-unpack read equals reading pynvml's structure attribute by attribute."""
from __future__ import annotations

import struct

import pynvml
from hypothesis import given, strategies as st

from otel_gpu.sources.fake_nvml import FakeNvml
from otel_gpu.sources.gpm_request import MetricsRequest, results_layout

_IDS = st.lists(st.integers(1, pynvml.NVML_GPM_METRIC_MAX - 1), min_size=1, max_size=12, unique=True)
_ANSWERS = st.tuples(st.sampled_from([pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED,
                                      pynvml.NVML_ERROR_INVALID_ARGUMENT]),
                     st.floats(allow_nan=False, allow_infinity=True, width=64))


class _Nvml:
    """pynvml's structures and constants; `nvmlGpmMetricsGet` answers through the structure's
    attributes, as NVML fills the same memory. `rewrite` replaces the ids it was asked for."""

    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION

    def __init__(self, answers, rewrite=None):
        self.answers, self.rewrite = answers, rewrite

    def nvmlGpmMetricsGet(self, req):
        assert req.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        for k in range(req.numMetrics):
            m = req.metrics[k]
            m.nvmlReturn, m.value = self.answers[k]
            if self.rewrite is not None:
                m.metricId = self.rewrite[k]
        return req


def _by_attributes(req, n):
    return [(req.metrics[k].metricId, req.metrics[k].nvmlReturn, req.metrics[k].value) for k in range(n)]


def test_the_pinned_binding_is_read_in_one_unpack():
    assert results_layout(pynvml.c_nvmlGpmMetricsGet_t) == (pynvml.c_nvmlGpmMetricsGet_t.metrics.offset, 40, "IId")
    assert results_layout(FakeNvml.c_nvmlGpmMetricsGet_t) is None       # plain attributes: read one by one
    assert results_layout(pynvml.c_nvmlMemory_t) is None                 # no metrics array


@given(st.lists(st.tuples(_IDS, st.data()), min_size=1, max_size=4))
def test_same_results_as_attribute_reads(rounds):
    """Over rounds whose metric sets change (ids written again) or stay (written once)."""
    nvml = _Nvml([])
    request = MetricsRequest(nvml)
    for ids, data in rounds:
        nvml.answers = data.draw(st.lists(_ANSWERS, min_size=len(ids), max_size=len(ids)))
        got = request.run(tuple(ids), None, None)
        want = _by_attributes(request.request, len(ids))
        assert [(i, r) for i, r, _ in got] == [(i, r) for i, r, _ in want] == [
            (i, a[0]) for i, a in zip(ids, nvml.answers)]
        assert [struct.pack("d", v) for _, _, v in got] == [struct.pack("d", v) for _, _, v in want]   # same bits


def test_ids_rewritten_by_nvml_are_reported_and_written_again():
    ids = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL)
    nvml = _Nvml([(0, 50.0), (0, 20.0)], rewrite=(0, 0))
    request = MetricsRequest(nvml)
    assert [i for i, _, _ in request.run(ids, None, None)] == [0, 0]    # what the request holds now
    nvml.rewrite = None
    assert request.run(ids, None, None) == [(ids[0], 0, 50.0), (ids[1], 0, 20.0)]


def test_the_fakes_plain_request_is_read_by_attributes():
    class FakeShaped(_Nvml):
        c_nvmlGpmMetricsGet_t = FakeNvml.c_nvmlGpmMetricsGet_t

    ids = (pynvml.NVML_GPM_METRIC_SM_UTIL, pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC)
    request = MetricsRequest(FakeShaped([(0, 50.0), (pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)]))
    assert request.run(ids, None, None) == [(ids[0], 0, 50.0), (ids[1], pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0)]
