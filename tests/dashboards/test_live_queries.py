"""Every query of every committed dashboard, interpolated as Grafana does, evaluated against real data.

Two node agents (8 and 2 fake Hopper GPUs through the fake NVML, this machine's /proc, an
InfiniBand fixture tree, link speeds) and four ranks of a real training loop using
`otel_gpu.training` (two jobs, each with rank 0 on node A and rank 1 on node B) export OTLP into
a real VictoriaMetrics (its OTLP receiver names series as Prometheus 3's does). The node names
are dotted host names, so a value that is not regex-escaped shows.

Each panel, variable and annotation query is interpolated with Grafana's rules for its
datasource (otel_gpu.dashboards.interpolate) for single, multi-value and "All" selections of
every variable, then run through VictoriaMetrics' PromQL API: it must return series, and every
series selector in it must select exactly the series the selection means. The ranks also run
the real pyroscope-io agent, pushing to a receiver that decodes the pprof: each flame graph's
interpolated selector must parse with Prometheus 3's parser (the one Pyroscope uses) and select
exactly the samples of the selected jobs, nodes, ranks and phase.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from otel_gpu.dashboards.interpolate import ALL, PROMETHEUS, PYROSCOPE, interpolate, variables
from otel_gpu.dashboards.panels import PROFILE_TYPE
from otel_gpu.dashboards.queries import matches, parse_selector, queries
from otel_gpu.names import PHASE_NAMES
from otel_gpu.promql import PromClient, PromError
from tests.agent.nodetree import sys_with_infiniband
from tests.pyroscope_receiver import Receiver
from tests.servers import CACHE, wait_until

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "grafana" / "dashboards").glob("*.json"))
HERE = Path(__file__).resolve().parent
LINK_MBPS = 25000   # the speed file written for every interface: 25 Gb/s
PROMTOOL3 = os.environ.get("OTELGPU_PROMTOOL3") or str(CACHE / "prometheus3" / "usr" / "bin" / "promtool")
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}
# series selectors in PromQL: `name{...}` or `{...}` (no braces inside in these dashboards)
SELECTOR = re.compile(r"[a-zA-Z_:][\w:]*\{[^{}]*\}|(?<![\w}])\{[^{}]*\}")
VAR_MATCHER = re.compile(r'(\w+)\s*=~\s*["`]\$\{?(\w+)(?::\w+)?\}?["`]')


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
    """Two agents + two jobs of two ranks + pyroscope-io, all finished exporting."""
    vm, run = victoriametrics, uuid.uuid4().hex[:6]
    nodes = (f"gpu-a.dash-{run}.example", f"gpu-b.dash-{run}.example")
    jobs = (f"dash-{run}-1", f"dash-{run}-2")
    root = tmp_path_factory.mktemp("dash-node")
    (root / "ckpt").mkdir()
    sys_root = sys_root_with_link_speeds(root)
    agents = [subprocess.Popen(
        [sys.executable, "-m", "otel_gpu", "agent", "--no-live", "--interval", "0.5", "--fake-gpus", gpus,
         "--sys-root", str(sys_root), "--checkpoint-dir", str(root / "ckpt"), "--process", "train_loop.py"],
        env=_env(vm.url, OTEL_RESOURCE_ATTRIBUTES=f"host.name={node}"), cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for node, gpus in zip(nodes, ("8", "2"))]
    try:
        with Receiver() as pyroscope:
            ranks = [subprocess.Popen(
                [sys.executable, str(HERE / "train_loop.py"), "16", "0.4"],
                env=_env(vm.url, RANK=str(r), LOCAL_RANK="0", WORLD_SIZE="2", OTELGPU_JOB=job,
                         OTEL_RESOURCE_ATTRIBUTES=f"host.name={nodes[r]}",
                         OTELGPU_PYROSCOPE_URL=pyroscope.url, OTELGPU_PROFILE_UPLOAD_S="2"),
                cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for job in jobs for r in (0, 1)]
            for p in ranks:
                out, err = p.communicate(timeout=180)
                assert p.returncode == 0 and "finished" in out, err
        client = PromClient(vm.url)
        ours = f'host_name=~"gpu-(a|b)\\\\.dash-{run}\\\\.example"'

        def ready():
            vm.flush()
            return (len(client.query(f"otelgpu_train_steps_total{{{ours}}}")) == 4
                    and len(client.query(f"process_cpu_utilization_ratio{{{ours}}}")) >= 2
                    and len(client.query(f"otelgpu_gpu_sm_activity_ratio{{{ours}}}")) == 10)
        wait_until(ready, 45, "agent and training series in VictoriaMetrics", interval=0.5)
        options = {"job": list(jobs), "node": list(nodes), "gpu": [str(i) for i in range(8)],
                   "rank": ["0", "1"], "rank_b": ["0", "1"], "phase": list(PHASE_NAMES),
                   "shift": ["1h", "6h", "1d", "7d"]}
        yield {"client": client, "nodes": nodes, "jobs": jobs, "options": options, "profiles": pyroscope.profiles}
    finally:
        for agent in agents:
            agent.terminate()
        for agent in agents:
            assert agent.wait(timeout=15) == 0, agent.stderr.read()


def scenarios(fed) -> dict[str, dict]:
    """Selections of every variable: single values (two different ones), several values, All."""
    (a, b), (j1, j2) = fed["nodes"], fed["jobs"]
    return {
        "single": {"job": j1, "node": a, "gpu": "3", "rank": "0", "rank_b": "1", "phase": "forward", "shift": "1h"},
        "single, other": {"job": j2, "node": b, "gpu": "1", "rank": "1", "rank_b": "0", "phase": "backward",
                          "shift": "1h"},
        "multi": {"job": [j1, j2], "node": [a, b], "gpu": ["1", "3"], "rank": ["0", "1"], "rank_b": "0",
                  "phase": "forward", "shift": "6h"},
        "All": {"job": ALL, "node": ALL, "gpu": ALL, "rank": ALL, "rank_b": "1", "phase": ALL, "shift": "1h"},
    }


def dashboards():
    assert DASHBOARDS, "no generated dashboards under grafana/dashboards"
    return [json.loads(p.read_text()) for p in DASHBOARDS]


def allowed(dash_vars, name: str, selection, options) -> set[str] | None:
    """The label values a selection means; None: any value, the label absent too (All = ".*")."""
    if selection == ALL:
        return None if dash_vars[name].all_value == ".*" else set(options[name])
    return {selection} if isinstance(selection, str) else set(selection)


def expected(series: list[dict], template: str, dash_vars, selection, options) -> set[frozenset]:
    keep = []
    for labels in series:
        if all((ok := allowed(dash_vars, var, selection[var], options)) is None or labels.get(label, "") in ok
               for label, var in VAR_MATCHER.findall(template)):
            keep.append(frozenset(labels.items()))
    return set(keep)


def test_every_promql_query_selects_the_right_series_for_single_multi_and_all(fed):
    client, nodes, options = fed["client"], set(fed["nodes"]), fed["options"]
    cache: dict[str, list[dict]] = {}

    def series(selector: str) -> list[dict]:
        if selector not in cache:
            cache[selector] = [s.labels for s in client.query(selector) if s.labels.get("host_name") in nodes]
        return cache[selector]

    evaluated, problems = 0, []
    for dash in dashboards():
        dash_vars = variables(dash)
        dash_options = {**options, "node": list(fed["nodes"])}
        for q in queries(dash):
            if q.kind in ("profile", "grafana_tags") or "ALERTS{" in q.expr:
                continue   # ALERTS: only a Prometheus evaluating the rules has it (tests/alerts/test_live_alerts.py)
            for name, selection in scenarios(fed).items():
                def prom(text):
                    return interpolate(text, PROMETHEUS, dash_vars, selection, dash_options, BUILTINS)
                expr = prom(q.expr)
                try:
                    got = (client.label_values(q.label, match=expr or None) if q.kind == "label_values"
                           else client.query(expr))
                except PromError as exc:
                    problems.append(f"{q.dashboard}: {q.where} [{name}]: {expr}\n    {exc}")
                    continue
                evaluated += 1
                if not got:
                    problems.append(f"{q.dashboard}: {q.where} [{name}]: no series: {expr}")
                for template in SELECTOR.findall(q.expr):
                    if not VAR_MATCHER.search(template):
                        continue
                    everything = re.sub(r'\$\{?\w+(?::\w+)?\}?', ".*", template)
                    want = expected(series(everything), template, dash_vars, selection, dash_options)
                    have = {frozenset(s.items()) for s in series(prom(template))}
                    if have != want:
                        problems.append(f"{q.dashboard}: {q.where} [{name}]: {prom(template)} selects "
                                        f"{len(have)} series, {len(want)} meant; extra "
                                        f"{sorted(map(dict, have - want), key=str)[:2]}, missing "
                                        f"{sorted(map(dict, want - have), key=str)[:2]}")
    print(f"{evaluated} PromQL queries evaluated over {len(scenarios(fed))} selections, {len(problems)} problems")
    assert not problems, "\n".join(problems)
    assert evaluated >= 4 * 60


def test_variables_list_both_jobs_nodes_their_gpus_and_ranks(fed):
    client = fed["client"]
    by_var: dict[str, set] = {}
    for dash in dashboards():
        dash_vars = variables(dash)
        for q in queries(dash):
            if q.kind == "label_values":
                sel = fed["options"] | {"node": list(fed["nodes"])}
                expr = interpolate(q.expr, PROMETHEUS, dash_vars, scenarios(fed)["multi"], sel, BUILTINS)
                by_var.setdefault(q.where.split()[-1], set()).update(client.label_values(q.label, match=expr or None))
    assert set(fed["jobs"]) <= by_var["job"]
    assert set(fed["nodes"]) <= by_var["node"]
    assert {str(i) for i in range(8)} <= by_var["gpu"]
    assert {"0", "1"} <= by_var["rank"]


def test_straggler_panels_name_the_slow_rank(fed):
    """Rank 1 sleeps 1.5x longer in forward/backward and rank 0 waits for it in an all-reduce: the busy-time
    panel (step time minus collective wait) must show rank 1 busiest, though both ranks' steps are equally long."""
    client = fed["client"]
    checked = 0
    for dash in dashboards():
        busy = [q for q in queries(dash) if q.kind == "promql" and "collective_time" in q.expr
                and "step_duration_seconds_sum" in q.expr and "otelgpu_rank=~" in q.expr]
        for q in busy:
            for job in fed["jobs"]:
                selection = {**scenarios(fed)["All"], "job": job}
                expr = interpolate(q.expr, PROMETHEUS, variables(dash), selection,
                                   {**fed["options"], "node": list(fed["nodes"])}, BUILTINS)
                got = {s.labels.get("otelgpu_rank"): s.value for s in client.query(expr)}
                assert max(got, key=got.get) == "1", (q.where, got)
                checked += 1
    assert checked, "no busy-time panel"


def promql_parse(selector: str) -> list[tuple[str, str, str]]:
    """The matchers of a Pyroscope selector as Prometheus 3's parser reads them (promtool promql format)."""
    if not os.access(PROMTOOL3, os.X_OK):
        if os.environ.get("CI"):
            pytest.fail(f"{PROMTOOL3} missing (run .ci/install.sh)")
        pytest.skip("Prometheus 3's promtool is not installed (.ci/install.sh installs it)")
    # a name matcher only satisfies PromQL's rule that one matcher must not match ""
    query = '{__name__="process_cpu", ' + selector.strip()[1:]
    done = subprocess.run([PROMTOOL3, "--experimental", "promql", "format", query],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"Prometheus' parser rejects {selector}: {done.stderr.strip()}"
    return [m for m in parse_selector(done.stdout.strip()) if m[0] != "__name__"]


def samples_of(profiles):
    for p in profiles:
        for s in p.samples:
            yield p.series, s


def test_every_flame_graph_selects_exactly_the_chosen_profiles(fed):
    profiles = fed["profiles"]
    assert profiles, "pyroscope-io pushed nothing"
    name, sample_type, sample_unit = PROFILE_TYPE.split(":")[:3]
    assert {p.series.get("__name__") for p in profiles} == {name}
    assert all(p.sample_types[0] == (sample_type, sample_unit) for p in profiles)
    pushed = {(p.series["job"], p.series["node"], p.series["rank"]) for p in profiles}
    assert pushed == {(j, fed["nodes"][r], str(r)) for j in fed["jobs"] for r in (0, 1)}
    checked = 0
    for dash in dashboards():
        dash_vars = variables(dash)
        for q in (q for q in queries(dash) if q.kind == "profile"):
            for scenario, selection in scenarios(fed).items():
                text = interpolate(q.expr, PYROSCOPE, dash_vars, selection, fed["options"], BUILTINS)
                matchers = parse_selector(text)
                assert sorted(promql_parse(text)) == sorted(matchers), text   # promtool sorts them
                picked = {(series["job"], series["node"], series["rank"], s.labels.get("phase", ""))
                          for series, s in samples_of(profiles) if matches(matchers, {**series, **s.labels})}
                meant = {(series["job"], series["node"], series["rank"], s.labels.get("phase", ""))
                         for series, s in samples_of(profiles)
                         if expected([{**series, **s.labels}], q.expr, dash_vars, selection, fed["options"])}
                assert picked, f"{q.dashboard}: {q.where} [{scenario}]: {text} selects nothing"
                assert picked == meant, (q.where, scenario, text, sorted(picked ^ meant))
                checked += 1
    assert checked >= 4 * 5


def test_flame_graphs_show_the_code_of_the_selected_phase(fed):
    """Rank and phase filters cut: forward_pass runs in the forward phase only."""
    (flame,) = [q for dash in dashboards() for q in queries(dash)
                if q.kind == "profile" and q.where.startswith("panel 'Wall time")]
    dash = next(d for d in dashboards() if d["uid"] == flame.dashboard)
    text = interpolate(flame.expr, PYROSCOPE, variables(dash), scenarios(fed)["single"], fed["options"], BUILTINS)
    picked = [s for series, s in samples_of(fed["profiles"])
              if matches(parse_selector(text), {**series, **s.labels})]
    assert any("forward_pass" in s.stack for s in picked)
    assert not any("backward_pass" in s.stack for s in picked)


def test_grafanas_default_glob_and_a_quoted_regex_break_pyroscope_selectors(fed):
    """Why the flame graphs use ``node=~`${node:regex}` ``: the two other spellings fail."""
    node_var = {"node": variables(json.loads((REPO / "grafana" / "dashboards" / "profiles.json").read_text()))["node"]}
    two = {"node": list(fed["nodes"])}
    glob = interpolate('{node=~"$node"}', PYROSCOPE, node_var, two, two)
    assert glob == "{node=~\"{%s,%s}\"}" % fed["nodes"]
    assert not any(matches(parse_selector(glob), series) for series, _ in samples_of(fed["profiles"]))
    quoted = interpolate('{node=~"${node:regex}"}', PYROSCOPE, node_var, {"node": fed["nodes"][0]}, two)
    with pytest.raises(ValueError, match="unknown escape"):
        parse_selector(quoted)
    with pytest.raises(AssertionError, match="unknown escape sequence"):
        promql_parse(quoted)
