"""The shipped rules, live: a real 2-rank job, real Prometheus 3 evaluating the rules, real Alertmanager,
a webhook on loopback.

How the metrics reach Prometheus: the ranks export OTLP (under `otel-gpu run --no-record`, one export a
second) to VictoriaMetrics' OTLP receiver, which names series as Prometheus 3's receiver does; Prometheus 3
scrapes VictoriaMetrics' `/federate` every second for the job's series, keeping their timestamps and
labels. Prometheus 2.42 has no OTLP receiver and Debian's Prometheus 3.5.3 is built without it, so this
is the only way here to have Prometheus itself evaluate rules on OTLP-named series; like the OTLP
receiver, a federated scrape with sample timestamps writes no staleness markers. VictoriaMetrics makes
new samples searchable every few seconds (Prometheus got one sample in four); the test asks it to
flush twice a second, so the federated copy holds every sample the ranks sent.

The rules are `otel-gpu alerts` with short windows (8 s rates, `for: 3s`, 1 s evaluation, a stall after
max(10 x median step, 12 s)); Alertmanager runs the stack's compose/alertmanager.yml with the webhook as
its receiver and 1 s grouping. The job (tests/alerts/straggle_then_hang.py, no otel-gpu import) runs
clean for 20 s, then rank 1 straggles (60 ms more per ~80 ms step), then at 45 s rank 1 stops before a
collective; the script records both onsets. Bounds: the straggler alert naming rank 1 reaches the
webhook within STRAGGLER_BOUND_S of its onset, the stall alert naming rank 1 within STALL_BOUND_S of
the hang; no alert of the job before the straggle onset.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from otel_gpu.dashboards.interpolate import ALL, PROMETHEUS, interpolate, variables
from otel_gpu.dashboards.queries import queries
from otel_gpu.promql import PromClient
from tests.alerts.webhook import Webhook
from tests.childenv import clean_env
from tests.servers import (ALERTMANAGER_BIN, PROMETHEUS3_BIN, Alertmanager, Prometheus, ServerError, free_port,
                           require_binary, wait_until)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STRAGGLE_AT_S, HANG_AT_S = 20.0, 45.0
STRAGGLER_BOUND_S, STALL_BOUND_S = 45.0, 60.0
FAST = ["--window", "8s", "--periodic-window", "30s", "--gpu-window", "8s", "--error-window", "30s",
        "--fresh", "8s", "--lookback", "2m", "--interval", "1s", "--for", "3s"]
FAST_THRESHOLDS = "[stall]\nmin_s = 12\ngone_s = 5\n"


def prometheus_config(vm_host_port: str, am_host_port: str, job: str) -> str:
    return yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["fast.rules.yml"],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am_host_port]}]}]},
        "scrape_configs": [{
            "job_name": "victoriametrics-federate", "honor_labels": True, "metrics_path": "/federate",
            "params": {"match[]": [f'{{otelgpu_job="{job}"}}']}, "scrape_timeout": "1s",
            "fallback_scrape_protocol": "PrometheusText0.0.4",
            "static_configs": [{"targets": [vm_host_port]}]}],
    }, sort_keys=False)


def alertmanager_config(hook_url: str) -> str:
    """The stack's configuration, its receiver `none` swapped for the webhook, grouping shortened."""
    cfg = yaml.safe_load((REPO / "compose" / "alertmanager.yml").read_text())
    cfg["receivers"].append({"name": "webhook", "webhook_configs": [{"url": hook_url, "send_resolved": False}]})
    cfg["route"].update(receiver="webhook", group_wait="1s", group_interval="1s", repeat_interval="1h",
                        group_by=["alertname", "otelgpu_job", "otelgpu_rank"])
    return yaml.safe_dump(cfg, sort_keys=False)


def firing(hook: Webhook, job: str, alertname: str) -> list[tuple[float, dict]]:
    return [(t, a) for t, a in hook.alerts() if a["labels"].get("alertname") == alertname
            and a["labels"].get("otelgpu_job") == job and a["status"] == "firing"]


def dashboard_alert_queries(client: PromClient, job: str, node: str) -> dict[str, list[dict]]:
    """Every dashboard query over ALERTS, interpolated for this job and node (All elsewhere), evaluated now."""
    out = {}
    for path in sorted((REPO / "grafana" / "dashboards").glob("*.json")):
        dash = json.loads(path.read_text())
        dash_vars = variables(dash)
        selection = {name: ALL for name in dash_vars} | {"job": job, "node": node}
        for q in queries(dash):
            if q.kind == "promql" and "ALERTS{" in q.expr:
                expr = interpolate(q.expr, PROMETHEUS, dash_vars, selection, {name: [] for name in dash_vars},
                                   {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"})
                out[f"{q.dashboard}: {q.where}"] = [s.labels for s in client.query(expr)]
    return out


@pytest.fixture(scope="module")
def scenario(victoriametrics, tmp_path_factory):
    pytest.importorskip("torch", reason="torch not installed (pip install 'otel-gpu[train]')")
    require_binary(PROMETHEUS3_BIN, "Prometheus 3 (Debian sid's prometheus package)")
    require_binary(ALERTMANAGER_BIN, "Alertmanager (Debian's prometheus-alertmanager)")
    tmp = tmp_path_factory.mktemp("live-alerts")
    job = f"alerts-{uuid.uuid4().hex[:8]}"
    (tmp / "fast.toml").write_text(FAST_THRESHOLDS)
    prom_dir = tmp / "prometheus"
    prom_dir.mkdir()
    made = subprocess.run([sys.executable, "-m", "otel_gpu", "alerts", "--out", str(prom_dir / "fast.rules.yml"),
                           "--thresholds", str(tmp / "fast.toml"), *FAST], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    truth = tmp / "truth.jsonl"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=victoriametrics.url + "/opentelemetry",
                    OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf", OTEL_METRIC_EXPORT_INTERVAL="1000")
    command = [sys.executable, "-m", "otel_gpu", "run", "--no-record", "--no-profile", "--job", job, "--grace", "2",
               "--", sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               "--master_port", str(free_port()), str(HERE / "straggle_then_hang.py"),
               "--straggle-at", str(STRAGGLE_AT_S), "--hang-at", str(HANG_AT_S), "--truth", str(truth)]
    done = threading.Event()

    def flush():   # VictoriaMetrics' fresh samples searchable at once, for the federated scrape
        while not done.wait(0.5):
            try:
                victoriametrics.flush()
            except (httpx.HTTPError, ServerError):
                pass   # a missed flush only delays samples by a second
    flusher = threading.Thread(target=flush, daemon=True)
    flusher.start()
    with Webhook() as hook, Alertmanager(alertmanager_config(hook.url), tmp / "alertmanager") as am:
        prom = Prometheus(prometheus_config(victoriametrics.host_port, am.host_port, job), prom_dir,
                          binary=PROMETHEUS3_BIN)
        with prom:
            client = PromClient(prom.url)
            started = time.time()
            proc = subprocess.Popen(command, env=env, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
            try:
                straggler = wait_until(lambda: firing(hook, job, "OtelGpuStraggler"), 150,
                                       "a straggler alert at the webhook", interval=0.5)
                boards = dashboard_alert_queries(client, job, straggler[0][1]["labels"]["host_name"])
                stall = wait_until(lambda: firing(hook, job, "OtelGpuTrainingStalled"), 150,
                                   "a stall alert at the webhook", interval=0.5)
            finally:
                os.killpg(proc.pid, signal.SIGTERM)   # `otel-gpu run` forwards it; the sleeping rank is killed after --grace
                output = proc.communicate(timeout=60)[0]
            ended = time.time()
    done.set()
    flusher.join()
    onsets = {}
    for line in truth.read_text().splitlines():
        event = json.loads(line)
        onsets[event["event"]] = event["t"]
    print(f"live alerts: job ran {ended - started:.0f} s; straggler alert {straggler[0][0] - onsets['straggle']:.1f} s "
          f"after its onset, stall alert {stall[0][0] - onsets['hang']:.1f} s after the hang")
    return {"job": job, "hook": hook, "onsets": onsets, "straggler": straggler, "stall": stall, "boards": boards,
            "output": output}


def test_the_straggler_alert_names_rank_1_within_the_bound(scenario):
    onset = scenario["onsets"]["straggle"]
    t, first = scenario["straggler"][0]
    assert t - onset <= STRAGGLER_BOUND_S, f"{t - onset:.1f} s after the onset"
    ranks = {a["labels"]["otelgpu_rank"] for _, a in scenario["straggler"]}
    assert ranks == {"1"}, scenario["straggler"]
    assert first["labels"]["severity"] in ("warning", "critical")
    assert first["annotations"]["description"].startswith("rank 1 on ")
    assert first["annotations"]["runbook"].endswith(f"--job {scenario['job']} --last 10m")


def test_the_stall_alert_names_the_rank_that_stopped(scenario):
    t, first = scenario["stall"][0]
    assert t - scenario["onsets"]["hang"] <= STALL_BOUND_S, f"{t - scenario['onsets']['hang']:.1f} s after the hang"
    named = {(a["labels"].get("otelgpu_rank"), a["labels"].get("otelgpu_holder")) for _, a in scenario["stall"]}
    assert named == {("1", "not_waiting")}, scenario["stall"]
    assert "Rank 1 is not inside a collective" in first["annotations"]["description"]


def test_nothing_fires_before_the_onset(scenario):
    onset = scenario["onsets"]["straggle"]
    early = [(a["labels"]["alertname"], a["startsAt"]) for t, a in scenario["hook"].alerts()
             if a["labels"].get("otelgpu_job") == scenario["job"] and t < onset]
    assert not early, early
    others = {a["labels"]["alertname"] for _, a in scenario["hook"].alerts()
              if a["labels"].get("otelgpu_job") == scenario["job"]} - {"OtelGpuStraggler", "OtelGpuTrainingStalled"}
    assert not others, others


def test_the_dashboards_show_the_firing_alert(scenario):
    boards = scenario["boards"]
    assert boards, "no dashboard query reads ALERTS"
    for where, series in boards.items():
        ours = [s for s in series if s.get("alertname") == "OtelGpuStraggler"]
        assert ours and all(s.get("otelgpu_rank") == "1" for s in ours), (where, series)
