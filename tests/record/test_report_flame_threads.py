"""Flame graphs show the user's program: otel-gpu's own threads apart, native-only threads named.

Unit tests of the one thread classification (otel_gpu.profile_threads) and of the report's trees
on small recordings written through the real store; then a real CPU torch job recorded by
`otel-gpu run` with profiling on, its report opened in headless Chromium.
"""
from __future__ import annotations

import json
import sqlite3
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_gpu.diagnose.profiles import from_samples
from otel_gpu.profile_threads import UNNAMED, is_own, native_label, thread_names
from otel_gpu.record.decode import ProfileRows
from otel_gpu.record.reader import Recording
from otel_gpu.record.store import Writer
from otel_gpu.report.flames import flames

from .conftest import HERE, record
from .test_report_browser import open_in_chromium

EXPORTER = ("Thread._bootstrap", "Thread._bootstrap_inner", "Thread.run", "PeriodicExportingMetricReader._ticker",
            "Event.wait", "Condition.wait")
names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=15)


# ---- the classification ---------------------------------------------------------------------
def test_own_threads_by_name_and_by_frames():
    assert is_own(["Thread._bootstrap", "Poller._run"], {"thread_name": "otelgpu-nccl-timing"})
    assert is_own(["Thread._bootstrap"], {"thread_name": "OtelPeriodicExportingMetricReader"})
    assert is_own(["Thread._bootstrap"], {"thread_name": "OtelBatchSpanRecordProcessor"})
    assert is_own(list(EXPORTER), {})                       # no thread name (older recordings): its frames
    assert not is_own(["<module>", "train"], {"thread_name": "MainThread"})
    assert not is_own([], {"thread_name": "pt_autograd_0"})
    assert not is_own(["Thread._bootstrap", "_pin_memory_loop"], {"thread_name": "Thread-1 (_pin_memory_loop)"})


@given(st.text(max_size=20))
def test_every_thread_named_otelgpu_is_ours(suffix):
    assert is_own(["Thread.run"], {"thread_name": "otelgpu" + suffix})


@given(names, st.lists(st.sampled_from(["<module>", "train", "Thread.run", "forward", "_bootstrap"]), max_size=5))
def test_other_names_are_the_users(name, stack):
    if name.startswith("otelgpu") or name.startswith("Otel"):
        return
    assert not is_own(stack, {"thread_name": name})


@given(st.integers(0, 63))
def test_autograd_threads_are_glossed(n):
    assert native_label(f"pt_autograd_{n}") == f"pt_autograd_{n} (native: backward kernels)"


@given(names)
def test_a_native_label_names_its_thread_or_says_it_cannot(name):
    label = native_label(name)
    assert label.startswith(name + " (native")
    assert native_label(None) == native_label("") == UNNAMED


def test_a_thread_named_in_a_later_push_is_named_in_earlier_ones():
    rows = [(("n", "0"), {"thread_id": "7"}), (("n", "0"), {"thread_id": "7", "thread_name": "pt_autograd_0"}),
            (("n", "1"), {"thread_id": "7"})]
    assert thread_names(rows) == {(("n", "0"), "7"): "pt_autograd_0"}


# ---- the report's trees on a recording ------------------------------------------------------
def _recording(directory, samples):
    """One rank's profile: samples (stack root first, sample labels, ns)."""
    w = Writer(directory, {"job": "j", "host": "n", "started": "100.0", "ended": "112.0", "exit_status": "0"})
    w.add_profiles([ProfileRows({"rank": "0", "node": "n", "job": "j"}, 100, 110, "wall", "nanoseconds", 20_000_000,
                                [(tuple(s), tuple(sorted(lab.items())), v) for s, lab, v in samples])])
    w.close()
    return Recording.open([directory])


def _children(f, flat):
    """{name: total} of the root's children in a flat preorder tree (name index, value, children per frame)."""
    out, open_ = {}, [flat[2]]
    for i in range(3, len(flat), 3):
        while open_[-1] == 0:
            open_.pop()
        open_[-1] -= 1
        if len(open_) == 1:
            out[f["names"][flat[i]]] = flat[i + 1]
        open_.append(flat[i + 2])
    return out


def test_own_threads_go_to_their_own_tree_and_native_time_is_named(tmp_path):
    main = {"thread_id": "1", "thread_name": "MainThread", "phase": "backward"}
    samples = [(["<module>", "train", "backward"], main, 4_000_000_000),
               (list(EXPORTER), {"thread_id": "2", "thread_name": "OtelPeriodicExportingMetricReader"}, 5_000_000_000),
               (["Thread._bootstrap", "Poller._run"], {"thread_id": "3", "thread_name": "otelgpu-nccl-timing"}, 1_000_000_000),
               ([], {"thread_id": "4"}, 1_000_000_000),                                   # named in a later push
               ([], {"thread_id": "4", "thread_name": "pt_autograd_0"}, 2_000_000_000),
               ([], {"thread_id": "5"}, 500_000_000),                                     # never named
               (list(EXPORTER), {}, 250_000_000)]                                         # an older recording's
    with _recording(tmp_path / "r", samples) as rec:
        f = flames(rec)
    assert set(f["trees"]) == {"0|backward", "0|(no phase)"}
    assert f["trees"]["0|backward"][1] == 4_000_000_000
    user = _children(f, f["trees"]["0|(no phase)"])
    assert user == {"pt_autograd_0 (native: backward kernels)": 3_000_000_000, UNNAMED: 500_000_000}
    assert {f["names"][i] for i in f["native"]} == set(user)
    assert set(f["own_trees"]) == {"0|(no phase)"}
    assert f["own_trees"]["0|(no phase)"][1] == 6_250_000_000
    assert f["phases"] == ["backward", "(no phase)"] and f["ranks"] == ["0"]


def test_the_diagnosis_leaves_out_the_same_threads():
    """An otel-gpu thread whose frames look like communication is not training time."""
    s = from_samples([(["send", "Poller._run"], 1e9, {"thread_name": "otelgpu-nccl-timing"}, {"rank": "0"}),
                      (["all_reduce", "backward"], 1e9, {"thread_name": "MainThread", "phase": "backward"}, {"rank": "0"}),
                      (["train"], 2e9, {"thread_name": "MainThread", "phase": "forward"}, {"rank": "0"}),
                      (list(reversed(EXPORTER)) + ["Session.send"], 5e9, {}, {"rank": "0"})])
    assert s.training_s == pytest.approx(3.0) and s.comm_s == pytest.approx(1.0)


# ---- a real recorded job, in Chromium -------------------------------------------------------
def _seconds(directory, where: str, args=()) -> float:
    db = sqlite3.connect(directory / "recording.sqlite")
    (ns,) = db.execute("SELECT sum(s.value) FROM samples s JOIN profiles p ON p.id = s.profile WHERE " + where,
                       args).fetchone()
    db.close()
    return (ns or 0) / 1e9


@pytest.mark.slow
def test_the_default_flame_graph_is_the_training_process_and_names_its_native_thread(tmp_path):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    truth_file = tmp_path / "threads.json"
    run = record(tmp_path / "run", [sys.executable, str(HERE / "native_thread_job.py"), str(truth_file), "8"],
                 "--no-agent", env=None)
    assert run.proc.returncode == 0, run.proc.stderr[-2000:]
    truth = json.loads(truth_file.read_text())
    d = run.directory
    everything = _seconds(d, "1")
    ours = ",".join(str(t) for t in truth["threads"])                  # the script's threads, as it saw them
    script = _seconds(d, f"json_extract(s.labels, '$.thread_id') IN ({','.join('?' * len(truth['threads']))})",
                      [str(t) for t in truth["threads"]])
    assert everything - script > 1.0, f"no otel-gpu thread was sampled ({ours}): nothing to leave out"

    dom, log = open_in_chromium(d / "report.html", "#rank=all&phase=all")
    assert dom.ready and "data-count" not in dom.ids["errors"], (dom.ids["errors"], log[-2000:])
    flame = dom.ids["flame"]
    shown = float(flame["data-total"])
    assert flame["data-own"] == "0"
    assert script >= 0.9 * shown, (script, shown, everything)
    assert shown >= 0.9 * script                                       # and the script's time is all there
    assert float(flame["data-own-left-out"]) == pytest.approx(everything - shown, abs=1e-3)
    assert f"{truth['worker']} (native code)" in flame["data-native"].split("|"), flame
    assert "Native (C++/CUDA) frames are not sampled" in (d / "report.html").read_text()

    with_own, _ = open_in_chromium(d / "report.html", "#rank=all&phase=all&own=1")
    assert float(with_own.ids["flame"]["data-total"]) == pytest.approx(everything, abs=1e-3)
