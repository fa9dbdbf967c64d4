"""What the process that combines the ranks' results keeps: each rank's result with the ranks' strings
shared, the all-ranks ATen table pooled without a pooled copy of every delay, the cross-rank medians
without numpy's median, and no trace decoder loaded there (the memory bar of bench/bench_trace.py)."""
import math
import os
import pickle
import subprocess
import sys

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from otel_gpu.trace import analyze as A
from otel_gpu.trace import aten_ops
from otel_gpu.trace.median import median

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from trace_shapes import write_set  # noqa: E402

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)


@given(st.lists(st.floats(allow_infinity=False, width=64), max_size=40))
@example([])
@example([1.0, math.nan, 3.0])
@example([0.1, 0.2])
def test_median_is_numpys(xs):
    with np.errstate(all="ignore"):
        want = float(np.median(np.array(xs, dtype=np.float64))) if xs else math.nan
    got = median(xs)
    assert (math.isnan(got) and math.isnan(want)) or got == want


delays = st.lists(st.floats(min_value=-1e6, max_value=1e9, allow_nan=False, width=64), min_size=1, max_size=6)
rank_groups = st.dictionaries(st.tuples(st.sampled_from(["aten::mm", "aten::add", "aten::copy_"]),
                                        st.sampled_from(["k1", "k1|k2", ""])),
                              st.tuples(delays, delays).map(lambda t: (t[0], t[1][:1] * len(t[0]))),
                              max_size=5)


@given(st.lists(rank_groups, max_size=5))
def test_pooled_table_is_the_table_of_every_ranks_delays_together(ranks):
    together: dict = {}
    for groups in ranks:
        for k, (op, rt) in groups.items():
            got = together.setdefault(k, ([], []))
            got[0].extend(op)
            got[1].extend(rt)
    packed = [A._pack_groups(g) for g in ranks]
    assert aten_ops.summarize_sums(A._pooled_sums(packed)) == aten_ops.summarize_groups(together)


@given(st.recursive(st.one_of(st.text(max_size=8), st.floats(width=64), st.integers(), st.none()),
                    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner,
                                                                                         max_size=4),
                                            st.tuples(inner, inner)), max_leaves=30))
@example([0.0, -0.0, 0.0, math.nan, "-0.0"])
@example({"a": [-0.0, 0.0], "b": (0.0, -0.0)})
def test_shared_result_is_the_same_result(value):
    p = pickle.loads(pickle.dumps({"rows": value, "again": value}))   # as a worker's result arrives
    shared = A.share_strings(p)
    assert repr(shared) == repr(p)   # (repr: NaN equal to itself)
    if isinstance(value, (list, dict)):
        assert shared["rows"] is shared["again"]   # one object stays one


def test_strings_of_two_ranks_become_one_object():
    a, b = (A.share_strings(pickle.loads(pickle.dumps({"fix": "Pad the dimension " + "x" * 300, "n": 0.5})))
            for _ in range(2))
    assert a["fix"] is b["fix"] and next(iter(a)) is next(iter(b))


def test_no_trace_decoder_is_loaded_where_results_are_combined(tmp_path):
    """(Where a finding asks for operator shapes, this process reads them from one rank's file, and
    loads a decoder then; the LLM-shaped set has no such finding.)"""
    folder = write_set("llm", str(tmp_path / "llm"), ranks=3, steps=3)
    code = ("import sys; from otel_gpu.trace.set_workers import analyze_folder; "
            "import otel_gpu.trace.report, otel_gpu.trace.cli; "
            "doc = analyze_folder(sys.argv[1], jobs=2); assert doc['ranks'] == [0, 1, 2], doc['ranks']; "
            "print(sorted(m for m in ('msgspec', 'orjson', 'isal', 'numpy.ma') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, folder], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
