"""The input-bound rule's share of the time stays a share: within [0, 100]% in its title and evidence, whatever
the data-wait, other phases and step times a window holds (counters read at export times on both edges can
count more phase time than the rank's estimated wall time)."""
from __future__ import annotations

import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from otel_gpu.diagnose.model import RankStats
from otel_gpu.diagnose.rules_train import input_bound
from otel_gpu.diagnose.thresholds import Thresholds

from .windows import T0, window

TH = Thresholds()
SECONDS = st.floats(min_value=0.0, max_value=5000.0, allow_nan=False)
PCT = re.compile(r"for data (-?[0-9.]+)% of the time$")


@st.composite
def ranks(draw):
    out = []
    for i in range(draw(st.integers(1, 3))):
        first = draw(st.floats(min_value=0.0, max_value=600.0))
        span = draw(st.floats(min_value=0.0, max_value=600.0))
        steps = draw(st.floats(min_value=0.0, max_value=1000.0))
        phases = {"data_wait": draw(SECONDS)}
        for p in draw(st.lists(st.sampled_from(["forward", "backward", "optimizer", "checkpoint"]), unique=True)):
            phases[p] = draw(SECONDS)
        out.append(RankStats(rank=str(i), host="n0", steps=steps, step_count=steps, step_time_s=draw(SECONDS),
                             phases=phases, samples=10, first_t=T0 + first, last_t=T0 + first + span,
                             first_step_s=draw(st.none() | SECONDS), started=draw(st.booleans())))
    return out


@settings(max_examples=200, deadline=None)
@given(ranks())
@example([RankStats(rank="0", host="n0", steps=10, step_count=10, step_time_s=11.0, phases={"data_wait": 11.011},
                    samples=3, first_t=T0, last_t=T0 + 11)])   # a sleepy loader: 100.1% of an 11 s wall
def test_the_data_wait_share_in_the_title_is_a_share(rs):
    for f in input_bound(window(ranks=rs, duration=1300.0), TH):
        m = PCT.search(f.title)
        assert m, f.title
        assert 0.0 <= float(m.group(1)) <= 100.0, f.title
        assert 0.0 <= f.lost_share <= 1.0 and 0.0 <= f.evidence["worst_share"] <= 1.0, f.evidence
        assert all(0.0 <= v <= 1.0 for v in f.evidence["per_rank_share"].values()), f.evidence
