"""Dashboards as code: generation, the --check drift gate, and the rules every panel follows (no servers)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from otel_gpu import names
from otel_gpu.cli import main
from otel_gpu.dashboards import build
from otel_gpu.dashboards.panels import GPU_TIME_PROFILE_TYPE, PROFILE_TYPE, PROMETHEUS_UID, PYROSCOPE_UID, UNITS
from otel_gpu.trace import gpu_push
from otel_gpu.dashboards.queries import (
    matches, parse_selector, parse_variable_query, queries, used_variables, variable_names,
)

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "grafana" / "dashboards"
EXPECTED = {"agent-health", "cluster-overview", "node-gpu", "profiles", "training"}
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


def committed() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(SRC.glob("*.json"))}


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels") or [])


def prometheus_names() -> set[str]:
    """Every series name the agent and the ranks can produce, in the OTLP translation form."""
    out = set()
    for spec in names.all_specs():
        specs = [spec, *(names.windowed_companions(spec) if spec.windowed else ())]
        for s in specs:
            base = s.prometheus_name()
            out |= {base + "_bucket", base + "_sum", base + "_count"} if s.kind == "histogram" else {base}
    return out


def metric_names(expr: str) -> set[str]:
    """Series names a PromQL expression reads (identifiers outside label matchers and groupings)."""
    found = set()
    for alternation in re.findall(r'__name__=~"([^"]*)"', expr):
        found |= set(alternation.split("|"))
    stripped = re.sub(r"\{[^}]*\}", "", expr)
    stripped = re.sub(r'"[^"]*"', "", stripped)   # string arguments (label_replace's label names) name no series
    stripped = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", stripped)
    found |= {t for t in re.findall(r"[a-zA-Z_][a-zA-Z0-9_]*", stripped) if t.startswith(("hw_", "system_", "process_", "otelgpu_"))}
    return found


# ---- generation and --check -------------------------------------------------------------
def test_committed_json_matches_the_code(capsys):
    assert main(["dashboards", "--check"]) == 0
    assert "5 dashboards match" in capsys.readouterr().out
    assert set(committed()) == EXPECTED


def test_out_writes_the_same_json(tmp_path):
    assert main(["dashboards", "--out", str(tmp_path)]) == 0
    for name in EXPECTED:
        assert (tmp_path / f"{name}.json").read_text() == (SRC / f"{name}.json").read_text()
    assert not list(tmp_path.glob(".*")), "temporary files left behind"


def test_check_fails_on_drift_and_names_the_file(tmp_path, capsys):
    for p in SRC.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    doc = json.loads((tmp_path / "training.json").read_text())
    doc["panels"][1]["title"] = "edited in the UI"
    (tmp_path / "training.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (tmp_path / "profiles.json").unlink()
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    assert main(["dashboards", "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "training.json: differs from training.dashboard.py" in err
    assert "profiles.json: missing" in err
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before, "--check wrote something"


def test_a_broken_definition_is_one_line_and_writes_nothing(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    shutil.copy(SRC / "training.dashboard.py", src)
    (src / "zz-broken.dashboard.py").write_text("from otel_gpu.dashboards.panels import timeseries\n"
                                                "dashboard = timeseries('t', '', [], 'percentunit')\n")
    assert main(["dashboards", "--src", str(src), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "zz-broken.dashboard.py" in err and "description" in err
    assert not out.exists()


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["dashboards", "--src", str(tmp_path / "nope")]) == 2
    assert main(["dashboards", "--src", str(tmp_path)]) == 2   # a folder without definitions
    err = capsys.readouterr().err
    assert "no such folder" in err and "no *.dashboard.py" in err


def test_rendering_is_deterministic():
    first = [g.text for g in build.generate(SRC)]
    assert first == [g.text for g in build.generate(SRC)]


# ---- what every panel must have -----------------------------------------------------------
def test_every_panel_has_a_one_line_description_a_datasource_and_a_unit():
    for name, dash in committed().items():
        assert dash["uid"].startswith("otelgpu-") and dash["schemaVersion"] >= 39
        for p in all_panels(dash["panels"]):
            if p["type"] == "row":
                continue
            where = f"{name}: {p['title']}"
            assert p["description"] and "\n" not in p["description"], where
            assert p["datasource"]["uid"] in (PROMETHEUS_UID, PYROSCOPE_UID), where
            assert p["targets"], where
            assert p["gridPos"]["w"] > 0 and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, where
            if p["type"] in ("timeseries", "stat"):
                assert p["fieldConfig"]["defaults"]["unit"] in UNITS, where
                assert p["datasource"]["uid"] == PROMETHEUS_UID, where


def test_units_are_what_a_gpu_engineer_expects():
    """Ratios in percent, throughput in bytes/s, durations in seconds."""
    checked = 0
    for dash in committed().values():
        for p in all_panels(dash["panels"]):
            if p["type"] != "timeseries":
                continue
            unit, exprs = p["fieldConfig"]["defaults"]["unit"], " ".join(t["expr"] for t in p["targets"])
            first = p["targets"][0]["expr"]
            if "_ratio" in first and "/" not in first:
                assert unit == "percentunit", p["title"]
            if re.search(r"rate\((system_network_io|system_disk_io|hw_gpu_io)_bytes_total[^/]*$", first):
                assert unit == "Bps", p["title"]
            if "bytes_per_second" in first and "/" not in first:
                assert unit == "Bps", p["title"]
            if "step_duration" in exprs and "quantile" in exprs:
                assert unit == "s", p["title"]
            checked += 1
    assert checked > 30


def test_panel_ids_and_dashboard_uids_are_unique():
    uids = [d["uid"] for d in committed().values()]
    assert len(uids) == len(set(uids))
    for dash in committed().values():
        ids = [p["id"] for p in all_panels(dash["panels"])]
        assert len(ids) == len(set(ids)) and all(ids)


def test_every_query_names_a_series_the_project_emits():
    known = prometheus_names()
    for dash in committed().values():
        for q in queries(dash):
            if q.kind in ("profile", "grafana_tags"):
                continue
            unknown = metric_names(q.expr) - known
            assert not unknown, f"{q.dashboard}: {q.where}: {sorted(unknown)} not in otel_gpu.names"


def test_the_name_check_catches_a_typo():
    assert metric_names('rate(hw_gpu_utilisation_ratio{host_name=~"$node"}[1m])') - prometheus_names() == {
        "hw_gpu_utilisation_ratio"}
    assert metric_names('sum by (otelgpu_rank) (otelgpu_train_steps_total{otelgpu_job="x"})') == {
        "otelgpu_train_steps_total"}


def test_every_template_variable_used_is_defined():
    for name, dash in committed().items():
        defined = variable_names(dash) | GRAFANA_BUILTINS
        for q in queries(dash):
            assert used_variables(q.expr + q.time_shift) <= defined, (name, q.where)
        for p in all_panels(dash["panels"]):
            assert used_variables(p.get("title", "")) <= defined, (name, p.get("title"))


def test_the_observation_method_is_on_the_cluster_overview():
    """Utilization next to SM activity first, then links against their speed, storage, CPU, step time."""
    dash = committed()["cluster-overview"]
    exprs = [q.expr for q in queries(dash)]
    first = next(p for p in dash["panels"] if p["type"] == "timeseries")
    assert [t["expr"].split("(")[-1].split("{")[0] for t in first["targets"]] == [
        "hw_gpu_utilization_ratio", "otelgpu_gpu_sm_activity_ratio", "otelgpu_gpu_tensor_activity_ratio"]
    for needle in ("system_network_io_bytes_total", "hw_network_io_bytes_total", "hw_network_bandwidth_limit",
                   "system_disk_io_bytes_total", "system_cpu_utilization_ratio", "otelgpu_train_step_duration"):
        assert any(needle in e for e in exprs), needle
    node = committed()["node-gpu"]
    assert {v["name"] for v in node["templating"]["list"]} == {"job", "node", "gpu", "rank"}


def test_training_dashboard_marks_checkpoints_and_stragglers():
    dash = committed()["training"]
    anns = [a for a in dash["annotations"]["list"] if "expr" in a]
    assert len(anns) == 2 and "otelgpu_train_checkpoints_total" in anns[0]["expr"]
    assert anns[1]["expr"].startswith('ALERTS{alertstate="firing"') and 'otelgpu_job=~"$job"' in anns[1]["expr"]
    timeline = [p for p in dash["panels"] if p["type"] == "state-timeline"]
    assert len(timeline) == 1 and "ALERTS{" in timeline[0]["targets"][0]["expr"]
    exprs = " ".join(q.expr for q in queries(dash))
    assert "otelgpu_phase" in exprs
    # stragglers by busy time (step time minus collective wait), not by step time: those move together
    assert "otelgpu_train_step_duration_seconds_sum" in exprs and "otelgpu_train_collective_time_seconds_total" in exprs
    straggler_row = [q.expr for q in queries(dash) if "collective_time" in q.expr]
    assert len(straggler_row) >= 3


def test_flame_graph_panels_target_pyroscope():
    dash = committed()["profiles"]
    flames = [p for p in all_panels(dash["panels"]) if p["type"] == "flamegraph"]
    assert len(flames) == 6
    for p in flames:
        (t,) = p["targets"]
        assert t["datasource"] == {"type": "grafana-pyroscope-datasource", "uid": PYROSCOPE_UID}
        assert t["queryType"] == "profile" and t["profileTypeId"] in (PROFILE_TYPE, GPU_TIME_PROFILE_TYPE)
        labels = {m[0] for m in parse_selector(t["labelSelector"])}
        assert labels <= {"job", "node", "rank", "phase", "service_name"}, labels
        # GPU time from traces has no phase label (otel_gpu/trace/gpu_push.py: service_name, rank, job)
        assert "job" in labels and ("phase" in labels) == (t["profileTypeId"] == PROFILE_TYPE)
    (gpu,) = [p for p in flames if p["targets"][0]["profileTypeId"] == GPU_TIME_PROFILE_TYPE]
    name, sample_type, unit = GPU_TIME_PROFILE_TYPE.split(":")[:3]
    assert (name, sample_type, unit) == (gpu_push.SAMPLE_TYPE, gpu_push.SAMPLE_TYPE, gpu_push.UNIT)
    assert [p["timeShift"] for p in flames].count("$shift") == 1
    titles = {p["title"] for p in flames}
    assert {"Rank $rank", "Rank $rank_b"} <= titles


# ---- pure helpers -----------------------------------------------------------------------
def test_parse_variable_queries():
    assert parse_variable_query('label_values(up{a="b, c"}, host_name)') == ("label_values", 'up{a="b, c"}', "host_name")
    assert parse_variable_query("label_values(otelgpu_rank)") == ("label_values", "", "otelgpu_rank")
    assert parse_variable_query("query_result(max(x))") == ("query_result", "max(x)", "")
    with pytest.raises(ValueError):
        parse_variable_query("metrics(.*)")


def test_label_selector_matching():
    m = parse_selector('{job=~"j1|j2", rank="3", phase!="eval", node!~"bad.*"}')
    assert m == [("job", "=~", "j1|j2"), ("rank", "=", "3"), ("phase", "!=", "eval"), ("node", "!~", "bad.*")]
    assert matches(m, {"job": "j2", "rank": "3", "node": "n1"})
    assert not matches(m, {"job": "j3", "rank": "3"})
    assert not matches(m, {"job": "j1", "rank": "3", "phase": "eval"})
    assert matches(parse_selector('{phase=~".*"}'), {})          # "All" also matches unphased samples
    with pytest.raises(ValueError):
        parse_selector('job="x"')


def test_every_dashboard_shows_the_findings_diagnose_posts():
    """The tag query (all tags must match) selects what `otel-gpu diagnose --grafana` writes."""
    from otel_gpu.diagnose.annotations import annotation_payloads

    report = {"job": "llama-7b", "start": 0, "end": 60, "findings": [
        {"missing": False, "ranges": [(10, 20)], "title": "t", "seen": "s", "action": "a",
         "rule": "checkpoint_stall", "severity": "warning"}]}
    (posted,) = annotation_payloads(report)
    for name, dash in committed().items():
        tags = [q for q in queries(dash) if q.kind == "grafana_tags"]
        assert len(tags) == 1, name
        wanted = set(tags[0].expr.split(","))
        assert wanted and wanted <= set(posted["tags"]), (name, wanted, posted["tags"])
        (ann,) = [a for a in dash["annotations"]["list"] if a.get("target", {}).get("type") == "tags"]
        assert ann["target"]["matchAny"] is False and ann["enable"] is True
