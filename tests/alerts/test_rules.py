"""The shipped Prometheus rules: generated from the thresholds, unit-tested with Prometheus 3's promtool,
checked with promtool and amtool, and `otel-gpu alerts` as a command (flags, bad input, --check)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.alerts import cli as alerts_cli
from otel_gpu.alerts import yamltext
from otel_gpu.alerts.doc import markdown_table
from otel_gpu.alerts.params import FOR_DEFAULTS, RuleParams, duration
from otel_gpu.alerts.render import render
from otel_gpu.diagnose.thresholds import DEFAULTS, Thresholds
from otel_gpu.errors import UsageError
from tests.servers import AMTOOL_BIN, PROMTOOL3_BIN, require_binary

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RULES = REPO / "compose" / "prometheus-rules" / "otel-gpu.rules.yml"
UNIT_TESTS = sorted(HERE.glob("*.test.yml"))
CLI = [sys.executable, "-m", "otel_gpu", "alerts"]


def shipped() -> dict:
    return yaml.safe_load(RULES.read_text())


def alerts(doc: dict) -> list[dict]:
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    require_binary(PROMTOOL3_BIN, "promtool 3 (Debian sid's prometheus package)")
    return subprocess.run([PROMTOOL3_BIN, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


# ---- the shipped file ---------------------------------------------------------------------
def test_the_shipped_file_is_what_the_code_generates():
    assert RULES.read_text() == render(Thresholds(), RuleParams())
    out = subprocess.run(CLI + ["--check"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "matches the code" in out.stdout


def test_promtool_checks_the_shipped_rules():
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in shipped()['groups'])} rules found" in out.stdout


@pytest.mark.parametrize("path", UNIT_TESTS, ids=lambda p: p.name)
def test_promtool_unit_tests(path):
    out = promtool("test", "rules", path.name, cwd=HERE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_unit_tested_firing_and_quiet():
    """Each alert name fires in some promtool test and is asserted quiet in another case."""
    fired, quiet = set(), set()
    for path in UNIT_TESTS:
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../../compose/prometheus-rules/otel-gpu.rules.yml"], path
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for a in alerts(shipped())}
    assert names == set(FOR_DEFAULTS)
    assert fired == names, f"never seen firing: {sorted(names - fired)}"
    assert quiet == names, f"never asserted quiet: {sorted(names - quiet)}"


def test_every_alert_has_severity_rule_annotations_and_a_runbook():
    for a in alerts(shipped()):
        assert a["labels"]["severity"] in ("info", "warning", "critical"), a["alert"]
        assert a["labels"]["otelgpu_rule"], a["alert"]
        assert set(a["annotations"]) == {"summary", "description", "runbook"}, a["alert"]
        assert a["annotations"]["runbook"].startswith(("otel-gpu diagnose --prometheus ", "otel-gpu doctor")), a["alert"]
        assert re.fullmatch(r"\d+[smh]", a["for"]), a["alert"]


def test_the_thresholds_are_the_diagnosis_thresholds():
    """One source of numbers: an override of the diagnosis thresholds changes the rules."""
    base = render(Thresholds(), RuleParams())
    for rule, key, value in (("input", "share_warning", 0.0625), ("straggler", "lateness_min_s", 0.0125),
                             ("stall", "min_s", 345.0), ("gpu_idle", "util_max", 0.0725),
                             ("checkpoint", "share_critical", 0.1875)):
        changed = render(Thresholds({rule: {key: value}}), RuleParams())
        assert f"{value:g}" in changed and f"{value:g}" not in base, (rule, key)


def test_the_docs_table_is_the_code():
    assert markdown_table() in (REPO / "docs" / "deploy.md").read_text(), \
        "docs/deploy.md alert table is stale: paste `python -m otel_gpu.alerts.doc`"


# ---- Alertmanager configuration ------------------------------------------------------------------
def amtool_check(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    require_binary(AMTOOL_BIN, "amtool (Debian's prometheus-alertmanager)")
    for name in ("slack_webhook_url", "pagerduty_routing_key", "alert_webhook_token"):
        (tmp_path / name).write_text("not-a-secret\n")
    f = tmp_path / "alertmanager.yml"
    f.write_text(text.replace("/run/secrets/", f"{tmp_path}/"))
    return subprocess.run([AMTOOL_BIN, "check-config", str(f)], capture_output=True, text=True, timeout=60)


def test_amtool_accepts_the_stack_config_and_its_commented_routing(tmp_path):
    text = (REPO / "compose" / "alertmanager.yml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["route"]["receiver"] == "none" and cfg["receivers"] == [{"name": "none"}]
    assert not re.search(r"(?i)(api_url|routing_key|service_key|password|token)\s*:", text.replace("_file:", "")), \
        "a secret in the file"
    ok = amtool_check(tmp_path, text)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # the commented-out receivers and routes, uncommented, are a valid configuration too
    uncommented = re.sub(r"^(\s*)# (\s*(?:- )?[a-z_]+:(?: .*)?)$", r"\1\2", text, flags=re.M)
    full = yaml.safe_load(uncommented)
    assert {r["name"] for r in full["receivers"]} == {"none", "slack", "pagerduty", "webhook"}
    assert len(full["route"]["routes"]) == 3
    out = amtool_check(tmp_path, uncommented)
    assert out.returncode == 0, out.stdout + out.stderr


def test_amtool_accepts_the_routing_example_of_the_docs(tmp_path):
    doc = (REPO / "docs" / "deploy.md").read_text()
    (example,) = [b for b in re.findall(r"```yaml\n(.*?)```", doc, re.S) if "receivers:" in b and "route:" in b]
    out = amtool_check(tmp_path, example)
    assert out.returncode == 0, out.stdout + out.stderr
    assert {r["name"] for r in yaml.safe_load(example)["receivers"]} >= {"slack", "pagerduty", "webhook"}


# ---- otel-gpu alerts: flags and bad input ----------------------------------------------------------
def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=60, cwd=cwd)


def test_short_windows_for_tests_give_valid_rules(tmp_path):
    out_file = tmp_path / "fast.rules.yml"
    thresholds = tmp_path / "t.toml"
    thresholds.write_text("[stall]\nmin_s = 8\ngone_s = 4\n")
    done = run_cli("--out", str(out_file), "--window", "10s", "--periodic-window", "30s", "--gpu-window", "10s",
                   "--error-window", "30s", "--fresh", "5s", "--lookback", "2m", "--interval", "1s", "--for", "3s",
                   "--thresholds", str(thresholds))
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(out_file.read_text())
    assert {g["interval"] for g in doc["groups"]} == {"1s"}
    assert {a["for"] for a in alerts(doc)} == {"3s"}
    assert "[10s]" in out_file.read_text() and "[5m]" not in out_file.read_text()
    assert promtool("check", "rules", str(out_file)).returncode == 0
    assert run_cli("--check", "--out", str(out_file)).returncode == 1   # other flags: not that file


@pytest.mark.parametrize("args, message", [
    (["--fresh", "5m"], "must be shorter than the stall threshold"),
    (["--lookback", "30s", "--fresh", "60s"], "--lookback must be longer than --fresh"),
    (["--window", "soon"], "expected e.g. 90s"),
    (["--window", "0s"], "must be positive"),
    (["--prometheus-url", "ftp://x"], "--prometheus-url"),
    (["--check", "--out", "-"], "--check needs a file"),
    (["--thresholds", "/no/such/file.toml"], "cannot read"),
])
def test_bad_flags_are_one_line_and_exit_2(args, message, tmp_path):
    done = run_cli(*args, "--out", str(tmp_path / "r.yml"), cwd=tmp_path) if "--out" not in args else run_cli(*args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "r.yml").exists()


def test_a_bad_thresholds_file_and_a_folder_as_out(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text("[stall]\nstep_factr = 3\n")
    done = run_cli("--thresholds", str(bad), "--out", str(tmp_path / "r.yml"))
    assert done.returncode == 2 and "unknown key stall.step_factr" in done.stderr and done.stderr.count("\n") == 1
    folder = run_cli("--out", str(tmp_path))
    assert folder.returncode == 2 and done.stderr.count("\n") == 1


def test_check_reports_a_drifted_file(tmp_path):
    f = tmp_path / "r.yml"
    f.write_text(RULES.read_text().replace(">= 0.05", ">= 0.06", 1))
    done = run_cli("--check", "--out", str(f))
    assert done.returncode == 1 and "differs" in done.stderr
    missing = run_cli("--check", "--out", str(tmp_path / "none.yml"))
    assert missing.returncode == 1 and "missing" in missing.stderr


durations = st.integers(min_value=1, max_value=10 * 86400)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(window=durations, fresh=st.integers(min_value=1, max_value=119), for_s=st.integers(0, 7200))
def test_any_valid_durations_render_rules_that_say_them(window, fresh, for_s):
    """Every window and `for:` the flags accept reaches the file as the same Prometheus duration."""
    p = RuleParams(window_s=window, fresh_s=fresh, lookback_s=fresh + 1).with_for(for_s)
    doc = yaml.safe_load(render(Thresholds(), p))
    assert {a["for"] for a in alerts(doc)} == {duration(for_s)}
    assert f"[{duration(window)}]" in str(doc)
    assert f"< {fresh:g})" in str(doc)


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12).filter(lambda s: s.strip()))
def test_parse_duration_flags_reject_or_accept_in_one_line(text):
    """--window and friends: a value is either a positive duration or one line on stderr (argparse)."""
    import argparse

    try:
        value = alerts_cli._duration(text)
    except argparse.ArgumentTypeError as exc:
        assert "\n" not in str(exc)
    else:
        assert value > 0


def test_duration_text():
    assert [duration(s) for s in (0.25, 1, 90, 300, 3600, 5400, 86400 + 1)] == \
        ["250ms", "1s", "1m30s", "5m", "1h", "1h30m", "1d1s"]


# ---- the YAML writer --------------------------------------------------------------------------------
scalars = st.one_of(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x85\u2028\u2029")),
                    st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False))
keys = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
trees = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(keys, trees, max_size=5))
def test_yaml_text_reads_back_as_what_was_written(obj):
    assert yaml.safe_load(yamltext.dump(obj) if obj else "{}") == obj


def test_yaml_text_keeps_expressions_as_literal_blocks():
    text = yamltext.dump({"expr": "a\n/\nb", "s": "yes", "d": "1m", "q": 'x{a="1"}'})
    assert "expr: |-\n  a\n  /\n  b\n" in text and 's: "yes"' in text and "d: 1m" in text
    assert yaml.safe_load(text) == {"expr": "a\n/\nb", "s": "yes", "d": "1m", "q": 'x{a="1"}'}


def test_render_refuses_unusable_parameters():
    with pytest.raises(UsageError, match="stall threshold"):
        render(Thresholds(), RuleParams(fresh_s=float(DEFAULTS["stall"]["min_s"][0])))
