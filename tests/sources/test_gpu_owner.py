"""Each GPU's series carry the job using it: fixture /proc trees laid out as Slurm (cgroup v1, v2) and
Kubernetes (containerd, CRI-O) lay them out, the fake NVML listing their PIDs, read through the agent's
sampler and rendered as its scrape endpoint renders them. Two jobs and two pods on one node, a job
leaving mid-run, bogus PIDs dropped and counted by reason, an idle GPU with no labels."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_gpu import names as N
from otel_gpu.agent.exposition import Renderer
from otel_gpu.agent.sampler import Exported, Sampler
from otel_gpu.agent.store import Store
from otel_gpu.sources.fake_nvml import FakeNvml, FakeProcess, H100_MIG, hopper
from otel_gpu.sources.gpu_owner import INVALID_PID, NOT_FOUND, Labels, clean, owner_attributes, pick
from otel_gpu.sources.cgroup_owner import CgroupOwner
from otel_gpu.sources.nvml import NvmlSource

CGROUPS = Path(__file__).resolve().parents[1] / "data" / "cgroup"
GIB = 2**30
POD_A = "0f5a7f8c-2b1e-4c55-9d0e-6f7a0c6b1e42"
POD_B = "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def _process(root: Path, pid: int, cgroup: str, env: dict[str, str], comm: str = "python") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "cgroup").write_text((CGROUPS / cgroup).read_text())
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


@pytest.fixture
def node(tmp_path):
    """A node of 6 GPUs: Slurm job 1234 (cgroup v2) on GPUs 0-1, job 2001 (v1) on 2, a containerd pod
    on 3, a CRI-O pod on 4, GPU 5 idle; bogus PIDs (0, 2^32-1, one not in /proc) beside them."""
    root = tmp_path / "proc"
    slurm = {"PATH": "/usr/bin", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "llama"}
    _process(root, 1001, "slurm_v2", {**slurm, "RANK": "0"})
    _process(root, 1002, "slurm_v2", {**slurm, "RANK": "1"})
    _process(root, 3001, "slurm_v1", {"SLURM_JOB_ID": "999", "SLURM_JOB_NAME": "bert"})   # the path wins
    _process(root, 4001, "k8s_containerd_systemd", {"POD_NAME": "trainer-0", "POD_NAMESPACE": "ml",
                                                    "OTELGPU_JOB": "gpt"})
    _process(root, 5001, "k8s_crio_systemd_guaranteed", {"HOSTNAME": "x"})
    _process(root, 6001, "systemd_user", {"HOME": "/root"}, comm="nvtop")
    gpus = [hopper(processes=(FakeProcess(1001, 30 * GIB), FakeProcess(0, GIB))),
            hopper(processes=(FakeProcess(1002, 30 * GIB), FakeProcess(2**32 - 1, GIB))),
            hopper(processes=(FakeProcess(3001, 10 * GIB),)),
            hopper(processes=(FakeProcess(4001, 20 * GIB), FakeProcess(6001, GIB))),
            hopper(processes=(FakeProcess(5001, 5 * GIB), FakeProcess(424242, GIB))),
            hopper()]
    clock = _Clock()
    fake = FakeNvml(gpus=gpus, costs={}, clock=clock)
    src = NvmlSource(nvml=fake, proc_root=str(root), cadence=False, clock=clock)
    sampler = _Sampler([src], Store(window_s=1.0), interval_s=0.25, clock=clock)
    renderer = Renderer(Exported(sampler).families, {N.HOST: "node-1"}, {"service.name": "otel-gpu-agent"})
    yield fake, src, sampler, renderer
    src.close()


class _Clock:
    """Seconds that move only when the sampler starts a round (0.25 s a round)."""

    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class _Sampler(Sampler):
    def read_once(self, source):
        self.clock.t += 0.25
        return super().read_once(source)


OWNER_KEYS = set(N.OWNER_ATTRIBUTES)


def _owners_by_gpu(readings, spec) -> dict[str, dict]:
    """GPU index -> its owner attributes on `spec`'s readings (one set per GPU, checked)."""
    out: dict[str, dict] = {}
    for r in readings:
        if r.spec is spec:
            owner = {k: v for k, v in r.attributes.items() if k in OWNER_KEYS}
            gpu = r.attributes[N.GPU_INDEX]
            assert out.setdefault(gpu, owner) == owner, (gpu, owner, out[gpu])
    return out


def test_each_gpu_carries_its_job_and_bogus_pids_are_dropped(node):
    fake, src, sampler, renderer = node
    sampler.read_once(src)
    readings = sampler.read_once(src)
    job = {N.JOB: "llama", N.SLURM_JOB_ID: "1234", N.SLURM_STEP_ID: "0"}
    expected = {"0": job, "1": job,
                "2": {N.JOB: "bert", N.SLURM_JOB_ID: "2001", N.SLURM_STEP_ID: "0"},
                "3": {N.JOB: "gpt", N.K8S_POD_UID: POD_A, N.K8S_POD_NAME: "trainer-0", N.K8S_NAMESPACE: "ml",
                      N.CONTAINER_ID: "3f2a9c5e1b7d4a6f8e0c2b4d6f8a0c2e4b6d8f0a2c4e6b8d0f2a4c6e8b0d2f4a"},
                "4": {N.K8S_POD_UID: POD_B,
                      N.CONTAINER_ID: "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90"},
                "5": {}}
    for spec in (N.GPU_POWER, N.GPU_UTILIZATION, N.GPU_ENERGY, N.GPU_MEMORY_USAGE, N.GPU_STATUS, N.GPU_SM_ACTIVITY):
        assert _owners_by_gpu(readings, spec) == expected, spec.name
    procs = {r.attributes[N.PID]: r.attributes for r in readings if r.spec is N.GPU_PROCESS_MEMORY}
    assert set(procs) == {"1001", "1002", "3001", "4001", "5001", "6001"}   # 0, 2^32-1, 424242 dropped
    assert procs["1002"][N.RANK] == "1" and procs["1002"][N.SLURM_JOB_ID] == "1234"
    assert not OWNER_KEYS & set(procs["6001"])   # nvtop beside the pod: its own series carry no pod
    assert src.gpu_pids() == {1001, 1002, 3001, 4001, 5001, 6001}
    assert src.error_reasons == {INVALID_PID: 2, NOT_FOUND: 1}

    text = renderer.render().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("otelgpu_agent_source_errors_total")]
    errors = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines}
    assert errors == {'otelgpu_agent_source_errors_total{host_name="node-1",otelgpu_source="nvml"}': 0,
                      'otelgpu_agent_source_errors_total{error_type="process_not_found",host_name="node-1",'
                      'otelgpu_source="nvml"}': 1,
                      'otelgpu_agent_source_errors_total{error_type="process_pid_invalid",host_name="node-1",'
                      'otelgpu_source="nvml"}': 2}
    power = [ln for ln in text.splitlines() if ln.startswith("hw_power_watts{")]
    assert sum('slurm_job_id="1234"' in ln for ln in power) == 2
    assert sum(f'k8s_pod_uid="{POD_A}"' in ln for ln in power) == 1
    assert not any("pid=" in ln and ('pid="0"' in ln or 'pid="4294967295"' in ln) for ln in text.splitlines())

    for _ in range(3):   # still listed: each dropped PID counted once
        sampler.read_once(src)
    assert src.error_reasons == {INVALID_PID: 2, NOT_FOUND: 1}
    assert src.describe()["dropped_processes"] == {"0": INVALID_PID, "424242": NOT_FOUND, "4294967295": INVALID_PID}


def test_labels_follow_the_job_and_drop_in_the_next_round(node):
    fake, src, sampler, renderer = node
    sampler.read_once(src)
    assert 'slurm_job_id="1234"' in renderer.render().decode()
    fake.set_processes(0, ())           # job 1234 leaves GPU 0 and 1 ...
    fake.set_processes(1, ())
    fake.set_processes(5, (FakeProcess(4001, GIB),))   # ... and the pod starts on the idle GPU 5
    readings = sampler.read_once(src)   # one round later
    owners = _owners_by_gpu(readings, N.GPU_POWER)
    assert owners["0"] == owners["1"] == {}
    assert owners["5"][N.K8S_POD_UID] == POD_A
    text = renderer.render().decode()
    assert 'slurm_job_id="1234"' not in text   # the old series are gone from the endpoint, not left stale
    assert sum(f'k8s_pod_uid="{POD_A}"' in ln for ln in text.splitlines() if ln.startswith("hw_power_watts{")) == 2
    fake.set_processes(0, (FakeProcess(1001, GIB),))   # the PID comes back (cached while listed, read anew)
    assert _owners_by_gpu(sampler.read_once(src), N.GPU_POWER)["0"][N.SLURM_JOB_ID] == "1234"


def test_shared_gpu_takes_the_largest_users_job_and_mig_its_devices(tmp_path):
    root = tmp_path / "proc"
    _process(root, 11, "slurm_v2", {"SLURM_JOB_NAME": "small"})
    _process(root, 12, "slurm_v1", {"SLURM_JOB_NAME": "big"})
    fake = FakeNvml(gpus=[hopper(processes=(FakeProcess(11, GIB), FakeProcess(12, 9 * GIB))),
                          hopper(mig_devices=H100_MIG, processes=(FakeProcess(11, GIB),))], costs={})
    src = NvmlSource(nvml=fake, proc_root=str(root), cadence=False)
    try:
        readings = src.read()
        power = _owners_by_gpu(readings, N.GPU_POWER)
        assert power["0"][N.SLURM_JOB_ID] == "2001"
        procs = {r.attributes[N.PID]: r.attributes[N.SLURM_JOB_ID] for r in readings
                 if r.spec is N.GPU_PROCESS_MEMORY and r.attributes[N.GPU_INDEX] == "0"}
        assert procs == {"11": "1234", "12": "2001"}
        mig_mem = {r.attributes[N.HW_ID]: r.attributes.get(N.SLURM_JOB_ID) for r in readings
                   if r.spec is N.GPU_MEMORY_USAGE and N.HW_PARENT in r.attributes}
        assert sorted(mig_mem.values(), key=str) == ["1234", None, None, None]   # the fake lists it on the first
        assert all(r.attributes.get(N.SLURM_JOB_ID) == "1234" for r in readings   # its GPU: one job on it
                   if r.spec is N.GPU_STATUS and r.attributes[N.GPU_INDEX] == "1" and N.HW_PARENT not in r.attributes)
    finally:
        src.close()


def test_owner_rules():
    assert owner_attributes(CgroupOwner("7", None), {"SLURM_JOB_ID": "8", "SLURM_STEP_ID": "3"}) == \
        ((N.SLURM_JOB_ID, "7"),)   # the path wins; the environment's step may belong to another job
    assert owner_attributes(CgroupOwner(), {"SLURM_JOB_ID": " 8 ", "SLURM_STEP_ID": "3"}) == \
        ((N.SLURM_JOB_ID, "8"), (N.SLURM_STEP_ID, "3"))
    assert owner_attributes(CgroupOwner(), {"POD_NAME": "a\nb", "OTELGPU_JOB": "x" * 129}) == ()
    assert clean("ok") == "ok" and clean("") is None and clean("\x1b[2J") is None
    a, b = ((N.JOB, "a"),), ((N.JOB, "b"),)
    assert pick([(1.0, 5, a), (1.0, 4, b), (0.5, 1, ())]) == b   # tie on memory: the lower PID
    assert pick([(0.0, 1, ()), (9.0, 2, ())]) == ()
    labels, shared = Labels(), {"hw.id": "GPU-0"}
    assert labels.apply([]) == []
    labels.set(a)
    first = labels.apply([N.GPU_POWER and _reading(shared)])
    again = labels.apply([_reading(shared)])
    assert first[0].attributes is again[0].attributes == {"hw.id": "GPU-0", N.JOB: "a"}
    assert shared == {"hw.id": "GPU-0"}   # never mutated


def _reading(attrs):
    from otel_gpu.readings import Reading
    return Reading(N.GPU_POWER, 1.0, attrs)


def test_through_a_real_prometheus_scrape_the_jobs_gpus_and_their_odd_link(node, prometheus):
    """The node's endpoint scraped by a real Prometheus: a job's GPUs selected by its labels, and the
    diagnosis's GPU summary over them names the one whose PCIe link trained lower."""
    from otel_gpu.agent.exposition import ScrapeEndpoint
    from otel_gpu.diagnose.consistency import gpu_consistency
    from otel_gpu.diagnose.model import Window
    from otel_gpu.diagnose.parse import parse_gpus
    from otel_gpu.diagnose.queries import gpu_summary
    from otel_gpu.diagnose.thresholds import Thresholds
    from otel_gpu.promql import PromClient
    from tests.servers import wait_until

    fake, src, sampler, renderer = node
    fake.set_health(1, pcie_link=(3, 4, 5, 16))

    def render():
        sampler.read_once(src)   # each scrape reads a fresh round
        return renderer.render()

    endpoint = ScrapeEndpoint(render, 0)
    client = PromClient(prometheus.url)
    try:
        prometheus.add_scrape_target("otelgpu-gpu-owner", f"127.0.0.1:{endpoint.port}", interval="1s")
        count = 'count(hw_power_watts{job="otelgpu-gpu-owner", slurm_job_id="1234", slurm_step_id="0"})'
        wait_until(lambda: [s.value for s in client.query(count)] == [2.0], 20, "job 1234's two GPUs scraped")
        pod = client.query(f'hw_power_watts{{job="otelgpu-gpu-owner", k8s_pod_uid="{POD_A}"}}')
        assert [(s.labels["otelgpu_gpu_index"], s.labels["k8s_namespace_name"]) for s in pod] == [("3", "ml")]
        errors = client.query('otelgpu_agent_source_errors_total{job="otelgpu-gpu-owner", error_type!=""}')
        assert {s.labels["error_type"]: s.value for s in errors} == {INVALID_PID: 2, NOT_FOUND: 1}
        sel = 'job="otelgpu-gpu-owner", otelgpu_job="llama"'
        gpus = wait_until(lambda: [g for g in parse_gpus(client.query(gpu_summary(sel, 30, 1))) if g.pcie_gen],
                          10, "the link readings")
        assert {(g.gpu, g.model, g.pcie_gen, g.pcie_width) for g in gpus} == {
            ("0", "NVIDIA H100 80GB HBM3", 5, 16), ("1", "NVIDIA H100 80GB HBM3", 3, 4)}
        window = Window(job="llama", start=0, end=1, step_s=1, interval_s=1, ranks=[], gpus=gpus, nodes=[])
        named = {f.evidence["property"]: f.where["gpus"] for f in gpu_consistency(window, Thresholds())}
        assert named == {"PCIe generation": ["node-1/gpu1"], "PCIe width (lanes)": ["node-1/gpu1"]}
    finally:
        prometheus.remove_scrape_target("otelgpu-gpu-owner")
        endpoint.close()
