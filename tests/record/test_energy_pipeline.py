"""Energy per step and per token through the real pipeline: `otel-gpu run` records a plain loop that
counts its tokens, beside a node agent reading one fake GPU's energy counter (the fake NVML, at its
H100 call cost: read every 10 s), and forwards every body to VictoriaMetrics. J/token is the energy
counter's increase between its reads during training over the tokens counted between the same
times; the recording, PromQL (raw samples) and the run summary agree, and the Training dashboard's
panel joins the GPU to the rank whose process it lists (the fake GPU lists the job's process)."""
from __future__ import annotations

import json
import sys
import uuid

import numpy as np
import pytest

from otel_gpu import names as N
from otel_gpu.dashboards.interpolate import PROMETHEUS, interpolate, variables
from otel_gpu.dashboards.queries import queries
from otel_gpu.energy import reads
from otel_gpu.energy_read import from_prometheus, from_recording
from otel_gpu.promql import PromClient
from otel_gpu.record.reader import Recording
from tests.childenv import clean_env
from tests.servers import wait_until

from .conftest import HERE, REPO, record

pytestmark = pytest.mark.slow
SECONDS = "22"   # two energy reads inside training at the fake H100 cost (every 10 s; the first may come before it)


def test_joules_per_token_recorded_and_served_agree(victoriametrics, tmp_path):
    vm, job = victoriametrics, f"energy-{uuid.uuid4().hex[:8]}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"{vm.url}/opentelemetry", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    # the job says it is rank 0 (local rank 0): the fake GPU 0 lists its process, as NVML lists a rank's CUDA process
    r = record(tmp_path / "run", ["env", "RANK=0", "LOCAL_RANK=0", "WORLD_SIZE=1", sys.executable,
                                  str(HERE / "tokens_job.py"), SECONDS], "--job", job, "--no-profile",
               "--agent-arg=--fake-gpus=1", "--agent-arg=--process=tokens_job.py", env=env, cwd=tmp_path)
    assert r.proc.returncode == 0, r.proc.stderr[-3000:]
    with Recording.open([r.directory]) as rec:
        (row,), whole = from_recording(rec)
        (energy,) = rec.series(N.GPU_ENERGY.name)
        (tokens,) = rec.series(N.TRAIN_TOKENS.name)
        (steps,) = rec.series(N.TRAIN_STEPS.name)
        host = energy.get(N.HOST)
        lo, hi = tokens.points[0][0], tokens.points[-1][0]
        last_read = energy.points[-1][0]
        served_window = from_recording(rec, lo, hi)
    # the definition, from the raw points: energy reads (a new value) inside training, tokens between them
    inside = [(t, v) for t, v in reads(energy.points) if lo <= t <= hi]
    assert len(inside) >= 2, (inside, lo, hi)
    (a, ea), (b, eb) = inside[0], inside[-1]
    tt, tv = np.array(tokens.points).T
    st, sv = np.array(steps.points).T
    d_tokens = np.interp(b, tt, tv) - np.interp(a, tt, tv)
    d_steps = np.interp(b, st, sv) - np.interp(a, st, sv)
    assert row.joules == pytest.approx(eb - ea, rel=1e-9) and row.joules > 0 and row.resets == 0
    assert row.j_per_token == pytest.approx((eb - ea) / d_tokens, rel=1e-9), row
    assert row.j_per_step == pytest.approx((eb - ea) / d_steps, rel=1e-9), row
    assert whole.j_per_token == row.j_per_token and row.ranks == ("0",) and row.label == "GPU 0"
    assert row.basis == "the ranks whose processes this GPU lists"
    # a fake H100 at its load draws ~100-700 W; 512 tokens a ~40 ms step: about 13,000 tokens/s
    assert 100 / 13000 / 2 < row.j_per_token < 700 / 13000 * 2, row
    page = (r.directory / "report.html").read_text()
    assert '<table id="energy">' in page and f"{row.j_per_token:.3g} J/token" in page
    summary = r.proc.stdout + r.proc.stderr
    assert f"energy, GPU 0: {row.j_per_step:.3g} J/step, {row.j_per_token:.3g} J/token" in summary, summary
    # PromQL: the same raw samples, the same numbers
    with PromClient(vm.url) as client:
        def landed():   # every sample the recording holds is queryable (the last token and energy ones)
            vm.flush()
            wanted = {f'otelgpu_train_tokens_total{{otelgpu_job="{job}"}}[5m]': hi,
                      f'hw_energy_joules_total{{otelgpu_job="{job}"}}[5m]': last_read}
            return all(max((p[0] for x in client.query(q, time=max(hi, last_read) + 1) for p in x.points),
                           default=0.0) >= t - 0.002 for q, t in wanted.items())
        wait_until(landed, 20, "the run's last samples in VictoriaMetrics", interval=0.5)
        (prow,), pjob = from_prometheus(client.query, f'host_name="{host}",otelgpu_job="{job}"',
                                        f'otelgpu_job="{job}"', lo, hi)
        (rrow,), _ = served_window
        for key in ("joules", "steps", "tokens", "j_per_step", "j_per_token"):
            assert getattr(prow, key) == pytest.approx(getattr(rrow, key), rel=1e-3), (key, prow, rrow)   # ms timestamps there
        assert rrow.j_per_token == pytest.approx(row.j_per_token, rel=1e-9)
        # the Training dashboard's J/token panel (10-minute rates) once the last energy read is exported (a
        # read shows at the agent's next export: rates lag it by up to a read period)
        dash = json.loads((REPO / "grafana" / "dashboards" / "training.json").read_text())
        (panel,) = [q for q in queries(dash) if q.kind == "promql" and "hw_energy_joules_total" in q.expr]
        expr = interpolate(panel.expr, PROMETHEUS, variables(dash), {"job": job, "node": host, "rank": "0"},
                           {"job": [job], "node": [host], "rank": ["0"]}, {"__rate_interval": "1m"})
        got = {(s.labels.get("host_name"), s.labels.get("otelgpu_gpu_index")): s.value
               for s in client.query(expr, time=last_read)}
        energy_rate = client.query(f'max(rate(hw_energy_joules_total{{host_name="{host}", otelgpu_gpu_index="0"}}[10m]))',
                                   time=last_read)   # as the panel reads a GPU (other runs' series of it included)
        token_rate = client.query(f'sum(rate(otelgpu_train_tokens_total{{otelgpu_job="{job}"}}[10m]))', time=last_read)
    # GPU 0 (listing rank 0's process) over rank 0's tokens: the ratio of the two rates; no node-wide line
    assert set(got) == {(host, "0")} and got[(host, "0")] > 0, got
    assert got[(host, "0")] == pytest.approx(energy_rate[0].value / token_rate[0].value, rel=1e-9), (got, energy_rate, token_rate)
