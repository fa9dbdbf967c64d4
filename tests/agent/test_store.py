from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu import names
from otel_gpu.readings import Reading
from otel_gpu.agent.store import Store

A = {names.HW_ID: "GPU-a"}
B = {names.HW_ID: "GPU-b"}


def latest(store, name):
    """[(value, attributes dict)] of `name`, from the store's (values, keys) columns."""
    values, keys = store.columns(now=0.0)[name]
    return [(v, dict(k)) for v, k in zip(values, keys)]


def test_window_keeps_a_short_stall_visible():
    store = Store(window_s=10)
    for t, v in enumerate([0.9, 0.9, 0.0, 0.9, 0.9]):   # one 1-s stall in a 10-s window
        store.put("nvml", [Reading(names.GPU_UTILIZATION, v, A)], now=float(t))
    (mean,), (lo,), (hi,), (key,) = store.columns(now=4.0)[names.GPU_UTILIZATION.name]
    assert lo == 0.0 and hi == 0.9
    assert abs(mean - 0.72) < 1e-9
    assert dict(key) == A


def test_window_drops_samples_older_than_the_window():
    store = Store(window_s=2)
    for t, v in enumerate([0.0, 1.0, 1.0, 1.0]):
        store.put("nvml", [Reading(names.GPU_UTILIZATION, v, A)], now=float(t))
    (mean,), (lo,), (hi,), _ = store.columns(now=3.0)[names.GPU_UTILIZATION.name]
    assert (mean, lo, hi) == (1.0, 1.0, 1.0)
    # a source that stopped reporting 5 s ago has nothing left in its window
    assert store.columns(now=8.0)[names.GPU_UTILIZATION.name] == ([], [], [], ())


def test_series_a_source_stops_reporting_disappear():
    store = Store(window_s=5)
    store.put("nvml", [Reading(names.GPU_MEMORY_USAGE, 1, A), Reading(names.GPU_MEMORY_USAGE, 2, B)], now=0)
    store.put("nvml", [Reading(names.GPU_MEMORY_USAGE, 3, A)], now=1)
    assert latest(store, names.GPU_MEMORY_USAGE.name) == [(3, A)]
    store.forget("nvml")
    assert latest(store, names.GPU_MEMORY_USAGE.name) == []


def test_sources_do_not_erase_each_other():
    store = Store(window_s=5)
    store.put("a", [Reading(names.GPU_MEMORY_USAGE, 1, A)], now=0)
    store.put("b", [Reading(names.GPU_MEMORY_USAGE, 2, B)], now=0)
    store.put("a", [Reading(names.GPU_MEMORY_USAGE, 5, A)], now=1)
    assert sorted(v for v, _ in latest(store, names.GPU_MEMORY_USAGE.name)) == [2, 5]


def test_reused_attribute_objects_in_a_new_order_land_on_the_right_series():
    """The put's fast path matches a reading to last round's slot by spec and attribute
    object; readings that move, change spec or carry equal but new dicts must still be
    filed by their attributes."""
    store = Store(window_s=5)
    store.put("nvml", [Reading(names.GPU_MEMORY_USAGE, 1, A), Reading(names.GPU_MEMORY_LIMIT, 9, A),
                       Reading(names.GPU_MEMORY_USAGE, 2, B)], now=0)
    keys_before = store.columns(now=0.0)[names.GPU_MEMORY_USAGE.name][1]
    store.put("nvml", [Reading(names.GPU_MEMORY_USAGE, 4, B), Reading(names.GPU_MEMORY_USAGE, 3, dict(A)),
                       Reading(names.GPU_MEMORY_LIMIT, 8, A)], now=1)
    assert sorted(latest(store, names.GPU_MEMORY_USAGE.name), key=str) == [(3, A), (4, B)]
    assert latest(store, names.GPU_MEMORY_LIMIT.name) == [(8, A)]
    # a series that lives on keeps its key object (the exposition caches label text by it)
    assert {id(k) for k in store.columns(now=0.0)[names.GPU_MEMORY_USAGE.name][1]} == {id(k) for k in keys_before}


def test_a_nan_leaves_the_window_mean_when_it_leaves_the_window():
    store = Store(window_s=2)
    for t, v in enumerate([float("nan"), 0.5, 0.5, 0.5, 0.5]):
        store.put("nvml", [Reading(names.GPU_UTILIZATION, v, A)], now=float(t))
        (mean,), _, _, _ = store.columns(now=float(t))[names.GPU_UTILIZATION.name]
        assert (mean != mean) == (t <= 2)   # NaN while the NaN sample is inside the 2-s window
    assert store.columns(4.0)[names.GPU_UTILIZATION.name][0] == [0.5]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 0.7), st.sampled_from([0.0, -0.0, 0.5, 1.0, 2.0, -1.0, float("inf")]),
                          st.integers(0, 3)), min_size=1, max_size=60))
def test_window_min_max_match_the_samples_in_the_window(steps):
    """The extremes kept from export to export equal min/max over the window's samples, however
    puts, exports and samples leaving the window interleave (ties, repeats, infinities included;
    of 0.0 and -0.0 the one min/max give: the first in the window, as the scrape text shows it)."""
    store = Store(window_s=1.0)
    now, samples = 0.0, []   # one clock for puts and exports, never going back
    for dt, value, exports in steps:
        now += dt
        store.put("s", [Reading(names.GPU_UTILIZATION, value, {"k": "v"})], now)
        samples.append((now, value))
        for _ in range(exports):
            columns = store.columns(now).get(names.GPU_UTILIZATION.name)
            window = [v for t, v in samples if t >= now - 1.0]
            assert repr((columns[1], columns[2])) == repr(([min(window)], [max(window)]) if window else ([], []))
            now += 0.06   # the next export is later (past the store's 0.05 s columns cache)


_POOL = [(spec, {"k": str(n)}) for spec in (names.GPU_UTILIZATION, names.GPU_MEMORY_USAGE) for n in range(4)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0.1, 0.8),
                          st.lists(st.tuples(st.integers(0, len(_POOL) - 1), st.booleans(),
                                             st.sampled_from([0.0, 0.5, 1.0, 2.5, 4.0])), max_size=6)),
                min_size=1, max_size=40))
def test_puts_in_any_order_file_every_reading_on_its_series(puts):
    """However a source's readings move between puts (same attribute objects or equal new ones,
    series dropped, added, repeated within a put), latest values and window statistics are those
    of a plain model: each series holds the readings of its source's last put and the window's
    samples. Each source reports its own series (the pool is split between them)."""
    store, window = Store(window_s=1.0), 1.0
    latest_of: dict[tuple, float] = {}
    samples: dict[tuple, list] = {}
    last_keys: dict[str, set] = {"a": set(), "b": set()}
    now = 0.0
    for source, dt, picks in puts:
        now += dt
        readings, keys = [], set()
        for index, fresh, value in picks:
            index = index - index % 2 + (source == "b")   # even pool entries are a's, odd ones b's
            spec, attrs = _POOL[index]
            readings.append(Reading(spec, value, dict(attrs) if fresh else attrs))
            key = (spec.name, tuple(attrs.items()))
            if key not in keys and key not in last_keys[source]:
                samples[key] = []   # a new series (or one that came back): a new window
            keys.add(key)
            latest_of[key] = value
            if spec.windowed:
                samples[key].append((now, value))
        for key in last_keys[source] - keys:
            latest_of.pop(key, None)
            samples.pop(key, None)
        last_keys[source] = keys
        store.put(source, readings, now)
        assert {(n, k): v for n, series in store.snapshot().items() for k, v in series.items()} == latest_of
        columns = store.columns(now)
        for (name, key), value in latest_of.items():
            cols = columns[name]
            if len(cols) == 2:
                assert cols[0][cols[1].index(key)] == value
                continue
            window_values = [v for t, v in samples[(name, key)] if t >= now - window]
            if not window_values:   # every sample left the window: no mean, no series
                assert key not in cols[3]
                continue
            row = cols[3].index(key)
            assert (cols[0][row], cols[1][row], cols[2][row]) == (
                sum(window_values) / len(window_values), min(window_values), max(window_values))


def test_a_series_reported_twice_in_a_put_keeps_both_samples_with_their_times():
    """A windowed series gets one sample per put of its source, timed by the source's put times;
    one reported twice in a put (then every put) keeps both samples, timed by itself."""
    store = Store(window_s=2.0)
    other = {"k": "other"}
    for t in range(4):   # t=0: once; from t=1 on, twice a put
        readings = [Reading(names.GPU_UTILIZATION, 10.0 * t, A), Reading(names.GPU_UTILIZATION, 1.0, other)]
        if t:
            readings.append(Reading(names.GPU_UTILIZATION, 10.0 * t + 1, A))
        store.put("s", readings, now=float(t))
    means, mins, maxs, keys = store.columns(now=3.0)[names.GPU_UTILIZATION.name]
    got = dict(zip(keys, zip(means, mins, maxs)))
    assert got[tuple(A.items())] == (sum([10, 11, 20, 21, 30, 31]) / 6, 10.0, 31.0)   # t = 1, 2, 3
    assert got[tuple(other.items())] == (1.0, 1.0, 1.0)
    means, mins, maxs, keys = store.columns(now=4.5)[names.GPU_UTILIZATION.name]
    assert dict(zip(keys, mins))[tuple(A.items())] == 30.0   # t=3 alone


def test_a_series_two_sources_report_is_windowed_by_each_samples_time():
    store = Store(window_s=1.0)
    for t in (0.0, 0.5, 1.0, 1.5, 2.0):
        source = "a" if t % 1 == 0 else "b"
        store.put(source, [Reading(names.GPU_UTILIZATION, t, A)], now=t)
        store.put(source + "-own", [Reading(names.GPU_UTILIZATION, 5.0, {source: "x"})], now=t)
    means, mins, maxs, keys = store.columns(now=2.0)[names.GPU_UTILIZATION.name]
    assert dict(zip(keys, zip(means, mins, maxs)))[tuple(A.items())] == (1.5, 1.0, 2.0)   # t = 1, 1.5, 2
