"""Every query of every committed dashboard, evaluated against real data.

The real node agent (8 fake Hopper GPUs through the fake NVML, this machine's /proc, an
InfiniBand fixture tree, link speeds) and two ranks of a real training loop using
`otel_gpu.training` export OTLP into a real VictoriaMetrics (its OTLP receiver names series
as Prometheus 3's does); each panel, variable and annotation query then runs through its
PromQL API with the template variables set to this run's job, node, GPU and ranks, and must
return series. The ranks also run the real pyroscope-io agent, pushing to a receiver that
decodes the pprof: each flame graph's label selector must select some of those samples.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from otel_gpu.dashboards.panels import PROFILE_TYPE
from otel_gpu.dashboards.queries import matches, parse_selector, queries, substitute
from otel_gpu.promql import PromClient, PromError
from tests.agent.nodetree import sys_with_infiniband
from tests.pyroscope_receiver import Receiver
from tests.servers import wait_until

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
HERE = Path(__file__).resolve().parent
LINK_MBPS = 25000   # the speed file written for every interface: 25 Gb/s


def sys_root_with_link_speeds(root: Path) -> Path:
    """The InfiniBand fixture tree, plus a `speed` for every interface of this machine."""
    sys_root = sys_with_infiniband(root)
    net = sys_root / "class" / "net"
    net.unlink()   # a link to the real /sys/class/net, whose virtual NICs have no speed
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        iface = line.split(":", 1)[0].strip()
        (net / iface).mkdir(parents=True)
        (net / iface / "speed").write_text(f"{LINK_MBPS}\n")
    return sys_root


def _env(vm_url: str, **extra: str) -> dict[str, str]:
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OTEL_", "OTELGPU_", "SLURM_", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=vm_url + "/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
               OTEL_METRIC_EXPORT_INTERVAL="1000", **extra)
    return env


@pytest.fixture(scope="module")
def fed(victoriametrics, tmp_path_factory):
    """Agent + two training ranks + pyroscope-io, all finished exporting; yields what the checks need."""
    vm, job = victoriametrics, f"dash-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("dash-node")
    (root / "ckpt").mkdir()
    agent = subprocess.Popen(
        [sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--interval", "0.5", "--fake-gpus", "8",
         "--sys-root", str(sys_root_with_link_speeds(root)), "--checkpoint-dir", str(root / "ckpt"),
         "--process", "train_loop.py"],
        env=_env(vm.url, OTEL_RESOURCE_ATTRIBUTES=f"otelgpu.job={job}"), cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with Receiver() as pyroscope:
            ranks = [subprocess.Popen(
                [sys.executable, str(HERE / "train_loop.py"), "20", "0.4"],
                env=_env(vm.url, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", OTELGPU_JOB=job,
                         OTELGPU_PYROSCOPE_URL=pyroscope.url, OTELGPU_PROFILE_UPLOAD_S="2"),
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
            for p in ranks:
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0 and "finished" in out, err
        client = PromClient(vm.url)
        sel = f'{{otelgpu_job="{job}"}}'

        def ready():
            vm.flush()
            return (len(client.query(f"otelgpu_train_steps_total{sel}")) == 2
                    and client.query(f"process_cpu_utilization_ratio{sel}")
                    and len(client.query(f"otelgpu_gpu_sm_activity_ratio{sel}")) == 8)
        wait_until(ready, 30, "agent and training series in VictoriaMetrics", interval=0.5)
        # as Grafana puts a single selected value into a regex matcher (these need no escaping)
        values = {"job": job, "node": socket.gethostname(), "gpu": "3", "rank": "1",
                  "rank_b": "0", "phase": "forward", "shift": "1h",
                  "__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
        yield {"client": client, "values": values, "job": job, "profiles": pyroscope.profiles}
    finally:
        agent.terminate()
        assert agent.wait(timeout=15) == 0, agent.stderr.read()


def all_queries():
    assert DASHBOARDS, "no generated dashboards under grafana/dashboards"
    out = []
    for path in DASHBOARDS:
        out += queries(json.loads(path.read_text()))
    return out


def test_every_promql_query_returns_series(fed):
    client, values = fed["client"], fed["values"]
    evaluated, empty = 0, []
    for q in all_queries():
        if q.kind == "profile":
            continue
        expr = substitute(q.expr, values)
        try:
            if q.kind == "label_values":
                got = client.label_values(q.label, match=expr or None)
            else:
                got = client.query(expr)
        except PromError as exc:
            got, expr = [], f"{expr}\n    {exc}"
        evaluated += 1
        if not got:
            empty.append(f"{q.dashboard}: {q.where}: {expr}")
    print(f"{evaluated} PromQL queries evaluated, {len(empty)} empty")
    assert not empty, "queries that returned no series:\n" + "\n".join(empty)
    assert evaluated >= 60


def test_variables_list_this_runs_job_node_gpus_and_ranks(fed):
    client, values = fed["client"], fed["values"]
    by_var = {}
    for q in all_queries():
        if q.kind == "label_values":
            by_var.setdefault(q.where.split()[-1], set()).update(
                client.label_values(q.label, match=substitute(q.expr, values) or None))
    assert fed["job"] in by_var["job"]
    assert socket.gethostname() in by_var["node"]
    assert {str(i) for i in range(8)} <= by_var["gpu"]
    assert {"0", "1"} <= by_var["rank"]


def test_straggler_panels_name_the_slow_rank(fed):
    """Rank 1 sleeps 1.5x longer in forward/backward: the 'slowest rank' query must say so."""
    client, values = fed["client"], fed["values"]
    slow = [q for q in all_queries() if q.kind == "promql" and "topk(1" in q.expr]
    assert slow, "no slowest-rank panel"
    for q in slow:
        got = client.query(substitute(q.expr, {**values, "rank": ".*"}))
        assert [s.labels.get("otelgpu_rank") for s in got] == ["1"], (q.where, got)


def test_every_flame_graph_selects_pushed_samples(fed):
    profiles = fed["profiles"]
    assert profiles, "pyroscope-io pushed nothing"
    name, sample_type, sample_unit = PROFILE_TYPE.split(":")[:3]
    assert {p.series.get("__name__") for p in profiles} == {name}
    assert all(p.sample_types[0] == (sample_type, sample_unit) for p in profiles)
    flames = [q for q in all_queries() if q.kind == "profile"]
    assert len(flames) >= 4
    for q in flames:
        for rank in ("0", "1"):
            matchers = parse_selector(substitute(q.expr, {**fed["values"], "rank": rank, "rank_b": rank}))
            picked = [(p.series, s) for p in profiles for s in p.samples if matches(matchers, {**p.series, **s.labels})]
            assert sum(s.value for _, s in picked) > 0, f"{q.dashboard}: {q.where}: {q.expr} selects nothing of rank {rank}"
            # the filters cut: only this rank, only the forward phase (where forward_pass runs)
            assert {series["rank"] for series, _ in picked} == {rank}
            assert {s.labels.get("phase") for _, s in picked} == {"forward"}
            assert any("forward_pass" in s.stack for _, s in picked)
