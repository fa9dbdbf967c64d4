from otel_gpu import names
from otel_gpu.readings import Reading
from otel_gpu.store import Store

A = {names.HW_ID: "GPU-a"}
B = {names.HW_ID: "GPU-b"}


def test_window_keeps_a_short_stall_visible():
    store = Store(window_s=10)
    for t, v in enumerate([0.9, 0.9, 0.0, 0.9, 0.9]):   # one 1-s stall in a 10-s window
        store.put("nvml", [Reading(names.GPU_UTILIZATION, v, A)], now=float(t))
    (mean, lo, hi, key), = store.window(names.GPU_UTILIZATION.name, now=4.0)
    assert lo == 0.0 and hi == 0.9
    assert abs(mean - 0.72) < 1e-9
    assert dict(key) == A


def test_window_drops_samples_older_than_the_window():
    store = Store(window_s=2)
    for t, v in enumerate([0.0, 1.0, 1.0, 1.0]):
        store.put("nvml", [Reading(names.GPU_UTILIZATION, v, A)], now=float(t))
    (mean, lo, hi, _), = store.window(names.GPU_UTILIZATION.name, now=3.0)
    assert (mean, lo, hi) == (1.0, 1.0, 1.0)


def test_series_a_source_stops_reporting_disappear():
    store = Store(window_s=5)
    store.put("nvml", [Reading(names.GPU_MEMORY_USAGE, 1, A), Reading(names.GPU_MEMORY_USAGE, 2, B)], now=0)
    store.put("nvml", [Reading(names.GPU_MEMORY_USAGE, 3, A)], now=1)
    assert [(v, dict(k)) for v, k in store.latest(names.GPU_MEMORY_USAGE.name)] == [(3, A)]
    store.forget("nvml")
    assert list(store.latest(names.GPU_MEMORY_USAGE.name)) == []


def test_sources_do_not_erase_each_other():
    store = Store(window_s=5)
    store.put("a", [Reading(names.GPU_MEMORY_USAGE, 1, A)], now=0)
    store.put("b", [Reading(names.GPU_MEMORY_USAGE, 2, B)], now=0)
    store.put("a", [Reading(names.GPU_MEMORY_USAGE, 5, A)], now=1)
    assert sorted(v for v, _ in store.latest(names.GPU_MEMORY_USAGE.name)) == [2, 5]
