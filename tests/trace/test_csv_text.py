"""csv_text writes, byte for byte, what csv.DictWriter writes of the rows made JSON-clean."""
import csv
import io
import json

import numpy as np
from hypothesis import given, settings, strategies as st

from otel_gpu.trace.analyze import jsonable
from otel_gpu.trace.csv_text import columns, csv_pieces, joined_pieces, rows_text


def reference(rows: list[dict]) -> str:
    """The plain way: DictWriter over each row made JSON-clean, dicts and lists as JSON text."""
    buf = io.StringIO()
    if rows:
        cols = list(dict.fromkeys(k for r in rows for k in r if not str(k).startswith("_")))
        w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in jsonable(r).items()})
    return buf.getvalue()


text = st.text(st.sampled_from('ab ,"\n\r\t;é\'x0'), max_size=6)
scalar = st.one_of(text, st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
                   st.booleans(), st.none(), st.floats(width=32).map(np.float32), st.integers(-5, 5).map(np.int64))
value = st.one_of(scalar, st.lists(scalar, max_size=3),
                  st.dictionaries(st.sampled_from(["k", "_p"]), scalar, max_size=2))
keys = st.sampled_from(["rank", "name", "_private", "a,b", 'q"', "", 3])
rows = st.lists(st.dictionaries(keys, value, max_size=5), max_size=6)


@settings(max_examples=400, deadline=None)
@given(rows, st.integers(1, 64))
def test_same_bytes_as_dictwriter(rs, size):
    assert "".join(csv_pieces(rs, size)) == reference(rs)


def test_pieces_bounded():
    rs = [{"name": "kernel," * 20, "n": i, "x": 0.5} for i in range(2000)]
    pieces = list(csv_pieces(rs, 4096))
    assert len(pieces) > 10 and max(map(len, pieces)) < 4096 + 200
    assert "".join(pieces) == reference(rs)


def test_lone_empty_field_quoted_as_csv_does():
    rs = [{"name": ""}, {"name": "a"}]
    assert "".join(csv_pieces(rs)) == reference(rs) == 'name\n""\na\n'


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 9), text, scalar).map(
    lambda t: {"rank": t[0], "name": t[1], "x": t[2]}), max_size=4), max_size=4))
def test_parts_made_apart_join_to_the_same_bytes(parts):
    """Each rank's lines made where the rank is analysed, joined under one header: the same file."""
    made = [(columns(p), rows_text(p, columns(p))) for p in parts]
    got = joined_pieces(made, lambda t: t)
    assert got is not None
    assert "".join(got) == reference([r for p in parts for r in p])


def test_parts_with_other_columns_are_not_joined():
    made = [(columns(p), rows_text(p, columns(p))) for p in ([{"a": 1, "b": 2}], [{"a": 1, "c": 2}])]
    assert joined_pieces(made, lambda t: t) is None
    assert joined_pieces([(["a"], "1\n")], lambda t: t) is None   # one column: a lone "" is quoted


def test_the_remembered_quoting_is_forgotten_and_remade_the_same(monkeypatch):
    """Past its size the process-wide cache of quoted strings starts again: the text is unchanged, and
    an empty string still writes as an empty field; long strings are quoted without being remembered."""
    import csv
    import io

    from otel_gpu.trace import csv_text

    monkeypatch.setattr(csv_text, "_QUOTED", {"": ""})
    monkeypatch.setattr(csv_text, "_QUOTED_MAX", 8)
    rows = [{"a": f"k,{i}", "b": "" if i % 3 else 'q"x', "c": "y" * (csv_text._QUOTED_LEN + i)} for i in range(40)]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["a", "b", "c"], lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    assert "".join(csv_text.csv_pieces(rows)) == buf.getvalue()
    assert len(csv_text._QUOTED) <= 8 and "" in csv_text._QUOTED
    assert not any(len(k) > csv_text._QUOTED_LEN for k in csv_text._QUOTED)


_series_values = st.sampled_from([np.int64, np.int32, np.float64]).flatmap(
    lambda dt: st.lists(st.integers(-10**6, 2**31 - 1) if dt is not np.float64 else
                        st.floats(-1e9, 1e9, allow_nan=False), max_size=6).map(lambda v: np.array(v, dtype=dt)))


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.one_of(st.integers(-1, 30), st.text(st.sampled_from('a,"%s\n\rd é'), max_size=5)),
                       st.tuples(_series_values, _series_values), max_size=4))
def test_series_file_is_what_csv_writer_writes(series):
    """A rank's time-series file: csv.writer's bytes for each point "ts,key,value" (str of each number)."""
    from otel_gpu.trace.rank_csv import series_csv
    series = {k: (ts[:len(v)], v[:len(ts)]) for k, (ts, v) in series.items()}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(("ts", "stream", "value"))
    for key, (ts, values) in series.items():
        w.writerows((t, key, v) for t, v in zip(ts.tolist(), values.tolist()))
    assert series_csv(("ts", "stream", "value"), series) == buf.getvalue()


_pair_values = st.sampled_from([np.float32, np.float64]).flatmap(
    lambda dt: st.lists(st.one_of(st.integers(-10 ** 6, 10 ** 6).map(float), st.floats(width=32),
                                  st.sampled_from([-0.0, 0.0, 1e15, 1e16, -1e15, 2.5])),
                        min_size=3, max_size=3).map(lambda v: np.array(v, dtype=dt)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(-2 ** 31, 2 ** 31 - 1), _pair_values), max_size=5),
       st.sampled_from([np.int32, np.int64]))
def test_launch_pair_file_writes_each_number_as_its_repr(rows, corr_dtype):
    from otel_gpu.trace.rank_csv import PAIR_COLUMNS, pairs_csv
    pairs = {"correlation": np.array([c for c, _ in rows], dtype=corr_dtype)}
    for j, c in enumerate(PAIR_COLUMNS[1:]):
        dt = rows[0][1].dtype if rows else np.float64
        pairs[c] = np.array([v[j] for _, v in rows], dtype=dt)
    want = ",".join(PAIR_COLUMNS) + "\n" + "".join(
        ",".join(repr(pairs[c].tolist()[i]) for c in PAIR_COLUMNS) + "\n" for i in range(len(rows)))
    assert pairs_csv(pairs) == want
