"""The watch's appear / change / clear state machine: said once, cleared only after the hold time."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from otel_gpu.diagnose.watch_state import RANK, Tracker, finding_key


def finding(rule="straggler", severity="warning", ranks=("1",), title=None, **extra):
    return {"rule": rule, "severity": severity, "title": title or f"rank {ranks[0]} is 12.5% late",
            "where": {"ranks": list(ranks)}, "missing": [], **extra}


def test_appears_after_confirm_and_clears_after_hold():
    tr = Tracker(hold_s=30, confirm=2, confirm_s=0)
    assert tr.update(0, [finding()]) == []                 # seen once: not yet
    (e,) = tr.update(10, [finding()])
    assert e["event"] == "appeared" and e["first_seen_t"] == 0 and e["t"] == 10
    assert tr.update(20, []) == []                          # gone 10 s: still open
    assert tr.update(30, [finding()]) == []                 # back within the hold: nothing said
    assert tr.update(50, []) == []
    (c,) = tr.update(60, [])                                # 30 s without it
    assert c["event"] == "cleared" and c["absent_s"] == 30


def test_numbers_in_the_title_do_not_make_a_new_finding_but_another_rank_does():
    a = finding(title="rank 1 is 12.5% late")
    b = finding(title="rank 1 is 31.0% late")
    assert finding_key(a) == finding_key(b)
    assert finding_key(a) != finding_key(finding(ranks=("0",), title="rank 0 is 12.5% late"))


def test_a_share_seen_on_other_ranks_or_a_periodic_drop_matched_to_another_cause_is_the_same_finding():
    assert finding_key(finding(rule="input", ranks=("0",))) == finding_key(finding(rule="input", ranks=("0", "1")))
    assert finding_key(finding(rule="periodic", title="activity drops at 3 data-loading bursts")) == \
        finding_key(finding(rule="periodic", title="activity drops at 4 checkpoints"))
    assert finding_key(finding(rule="throttle", title="power capping on 2 GPUs")) != \
        finding_key(finding(rule="throttle", title="GPUs running hot (87 C)"))


def test_worse_at_once_better_only_after_the_hold():
    tr = Tracker(hold_s=30, confirm=1, confirm_s=0)
    tr.update(0, [finding(severity="warning")])
    (e,) = tr.update(10, [finding(severity="critical")])
    assert (e["event"], e["severity"], e["previous_severity"]) == ("changed", "critical", "warning")
    assert tr.update(20, [finding(severity="warning")]) == []
    assert tr.update(40, [finding(severity="info")]) == []
    (d,) = tr.update(50, [finding(severity="warning")])       # lower for 30 s: the worst of them is said
    assert (d["event"], d["severity"], d["previous_severity"]) == ("changed", "warning", "critical")


def test_missing_input_notes_and_findings_below_the_minimum_are_not_watched():
    tr = Tracker(hold_s=0, confirm=1, confirm_s=0, min_severity="warning")
    assert tr.update(0, [finding(severity="info"), finding(rule="comm", missing=["collective time"])]) == []


def test_a_blip_shorter_than_confirm_is_never_said():
    tr = Tracker(hold_s=0, confirm=3, confirm_s=0)
    for t in range(0, 100, 10):
        assert tr.update(t, [finding()] if t % 20 == 0 else []) == []


sightings = st.lists(st.tuples(st.floats(0.5, 30), st.lists(st.tuples(st.sampled_from(["straggler", "input"]),
                                                                         st.sampled_from(["info", "warning", "critical"]),
                                                                         st.sampled_from(["0", "1"])), max_size=3)),
                     max_size=40)


def test_a_drift_shorter_than_confirm_s_is_never_said():
    tr = Tracker(hold_s=0, confirm=2, confirm_s=15)
    assert tr.update(0, [finding()]) == [] and tr.update(3, [finding()]) == [] and tr.update(6, []) == []
    assert [e["event"] for t in (9, 12, 15, 18, 21, 24) for e in tr.update(t, [finding()])] == ["appeared"]


@settings(max_examples=300, deadline=None)
@given(sightings, st.floats(0, 60), st.integers(1, 3), st.floats(0, 30))
def test_events_alternate_and_clear_only_after_the_hold(steps, hold, confirm, confirm_s):
    tr = Tracker(hold_s=hold, confirm=confirm, confirm_s=confirm_s)
    t, open_, last_seen, shown = 0.0, set(), {}, {}
    for dt, seen in steps:
        t += dt
        fs = [finding(rule=r, severity=s, ranks=(k,), title=f"rank {k} {r}") for r, s, k in seen]
        keys = {finding_key(f) for f in fs}
        events = tr.update(t, fs)
        said = [finding_key(e) for e in events]
        assert len(said) == len(set(said)), "one event per finding per evaluation"
        for e in events:
            k = finding_key(e)
            if e["event"] == "appeared":
                assert k not in open_ and k in keys and t - e["first_seen_t"] >= confirm_s - 1e-3   # times kept to ms
                open_.add(k)
            elif e["event"] == "changed":
                assert k in open_ and e["severity"] != e["previous_severity"] == shown[k]
            else:
                assert k in open_ and k not in keys and t - last_seen[k] >= hold
                open_.discard(k)
            shown[k] = e["severity"]
        for k in keys:
            last_seen[k] = t
        for k in keys & open_:   # worse than said is said at once
            worst = max((f["severity"] for f in fs if finding_key(f) == k), key=RANK.__getitem__)
            assert RANK[shown[k]] >= RANK[worst]
