"""Two nodes of one job, each recorded in its own directory: `report` and `diagnose` merge them."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from otel_gpu.record.diagnose import diagnose_recording
from otel_gpu.record.reader import Recording
from otel_gpu.report import data as rd
from otel_gpu.report.flames import flames
from tests.childenv import clean_env

from .conftest import REPO
from .synth import write_node


def two_nodes(tmp_path):
    t0 = time.time() - 600
    a, b = tmp_path / "node-a", tmp_path / "node-b"
    write_node(a, "node-a", [0, 1], gpus=2, t0=t0, seconds=40, data_wait_share=0.3)
    write_node(b, "node-b", [2, 3], gpus=2, t0=t0 + 0.3, seconds=40, data_wait_share=0.3)
    return a, b


def test_the_nodes_of_a_job_merge_into_one_window(tmp_path):
    a, b = two_nodes(tmp_path)
    r = diagnose_recording([a, b])
    w = r.window
    assert [(x.host, x.rank) for x in w.ranks] == [("node-a", "0"), ("node-a", "1"), ("node-b", "2"), ("node-b", "3")]
    assert sorted(g.name for g in w.gpus) == ["node-a/gpu0", "node-a/gpu1", "node-b/gpu0", "node-b/gpu1"]
    assert [n.host for n in w.nodes] == ["node-a", "node-b"]
    assert all(x.steps == 400 for x in w.ranks)
    assert "input" in {f.rule for f in r.findings}          # 30% of the time waiting for data on every rank
    with Recording.open([a, b]) as rec:
        flame = flames(rec)
        assert flame["ranks"] == ["node-a rank 0", "node-a rank 1", "node-b rank 2", "node-b rank 3"]
        steps = next(p for p in rd.plots(rec, w.start, w.end) if p["id"] == "step_time")
        assert [s["label"] for s in steps["series"]] == ["node-a rank 0", "node-a rank 1", "node-b rank 2", "node-b rank 3"]


def test_report_and_diagnose_commands_take_several_directories(tmp_path):
    a, b = two_nodes(tmp_path)
    env = clean_env()
    d = subprocess.run([sys.executable, "-m", "otel_gpu", "diagnose", str(a), str(b), "--json", "-"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert d.returncode == 0, d.stderr
    out = json.loads(d.stdout)
    assert (out["ranks"], out["gpus"], out["nodes"]) == (4, 4, 2)
    r = subprocess.run([sys.executable, "-m", "otel_gpu", "report", str(a), str(b), "-o", str(tmp_path / "job.html")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "node-b rank 3: 400 steps" in r.stdout and "job.html" in r.stdout
    assert "node-b rank 3" in (tmp_path / "job.html").read_text()


def test_whole_run_statistics_kept_at_close_equal_those_computed_from_the_points(tmp_path):
    a, _ = two_nodes(tmp_path)
    with Recording.open([a]) as rec:
        meta = rec.metas[0]
        inside = float(meta["ended"]) - 0.1          # a window that is not the whole run: computed from points
        assert rec._whole_run(rec.dbs[0], meta, -1e18, 1e18) and not rec._whole_run(rec.dbs[0], meta, -1e18, inside)
        for metric in rec.metrics():
            kept = {tuple(sorted(s.attrs.items())): st for s, st in rec.summaries(metric)}
            computed = {tuple(sorted(s.attrs.items())): st for s, st in rec.summaries(metric, None, inside)}
            assert kept.keys() == computed.keys() and kept
            for k, st in kept.items():
                c = computed[k]
                assert (st.n, st.first_t, st.last_t, st.first, st.last, st.max, st.last_count) == \
                    (c.n, c.first_t, c.last_t, c.first, c.last, c.max, c.last_count)
                assert abs(st.mean - c.mean) <= 1e-9 * max(1.0, abs(c.mean))
