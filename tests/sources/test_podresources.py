"""The kubelet PodResources reader against a real gRPC server on a unix socket serving fixture data as the
kubelet lays it out (fields this reader skips included): GPUs assigned to pods carry pod, namespace and
container through the agent (`agent --once --json`), also while idle; a GPU of no pod has none; a kubelet
that is down is said and nothing is guessed. Hypothesis over the response parsing, the owner merge and
--kubelet-socket."""
from __future__ import annotations

import json
import os
import shutil
import socket
import string
import subprocess
import sys
import tempfile
from concurrent import futures

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu import names as N
from otel_gpu.agent.cli import kubelet_socket
from otel_gpu.errors import UsageError
from otel_gpu.sources.fake_nvml import FakeNvml, hopper
from otel_gpu.sources.gpu_owner import with_assignment
from otel_gpu.sources.nvml import NvmlSource
from otel_gpu.sources.podresources import MESSAGES, ListRequest, ListResponse, PodResourcesReader, gpu_owners
from tests.childenv import clean_env

FAKE_UUID = "GPU-{:08x}-fa4e-4e00-8000-00005eed{:04x}"   # the fake NVML's UUIDs (fake_cluster_node)
Pod, Container, Devices = MESSAGES["PodResources"], MESSAGES["ContainerResources"], MESSAGES["ContainerDevices"]
TOPOLOGY = b"\x1a\x04\x0a\x02\x08\x00"   # ContainerDevices.topology = {nodes: [{ID: 0}]} (skipped by the reader)
CPU_IDS = b"\x1a\x02\x02\x03"            # ContainerResources.cpu_ids = [2, 3] (skipped by the reader)


def devices(resource: str, *ids: str):
    d = Devices(resource_name=resource, device_ids=list(ids))
    d.MergeFromString(TOPOLOGY)
    return d


def container(name: str, *devs):
    c = Container(name=name, devices=list(devs))
    c.MergeFromString(CPU_IDS)
    return c


def fixture_response():
    """Two GPUs to a training pod's container, one to an idle notebook, a NIC to a third pod."""
    return ListResponse(pod_resources=[
        Pod(name="train-0", namespace="team-a", containers=[
            container("trainer", devices("nvidia.com/gpu", FAKE_UUID.format(0, 0), FAKE_UUID.format(1, 1))),
            container("sidecar")]),
        Pod(name="notebook-7", namespace="team-b", containers=[
            container("jupyter", devices("nvidia.com/gpu", FAKE_UUID.format(2, 2)))]),
        Pod(name="net-1", namespace="team-c", containers=[container("app", devices("rdma/hca_shared", "3"))]),
    ])


class Kubelet:
    """A real gRPC server on a unix socket answering v1.PodResourcesLister/List with `response`."""

    def __init__(self, response):
        self.dir = tempfile.mkdtemp(prefix="kubelet-")   # short: unix socket paths are limited to 107 bytes
        self.path = os.path.join(self.dir, "kubelet.sock")
        self.response = response
        self.calls = 0
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(
            self._list, request_deserializer=ListRequest.FromString, response_serializer=ListResponse.SerializeToString)})
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.server.add_insecure_port(f"unix:{self.path}")

    def _list(self, request, context):
        self.calls += 1
        return self.response

    def __enter__(self):
        self.server.start()
        return self

    def __exit__(self, *exc):
        self.server.stop(grace=None).wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


def owners_by_gpu(readings) -> dict[str, dict]:
    """GPU UUID -> the owner attributes on its memory reading."""
    keys = (N.K8S_POD_NAME, N.K8S_NAMESPACE, N.K8S_CONTAINER_NAME)
    return {r[2][N.HW_ID]: {k: r[2][k] for k in keys if k in r[2]} for r in readings
            if r[0].name == N.GPU_MEMORY_USAGE.name}


def test_gpus_assigned_to_pods_carry_them_while_idle_and_others_none():
    gpus = [hopper(uuid=FAKE_UUID.format(i, i)) for i in range(4)]   # no process on any: all idle
    with Kubelet(fixture_response()) as kubelet:
        reader = PodResourcesReader(kubelet.path).start()
        source = NvmlSource(nvml=FakeNvml(gpus=gpus), pod_resources=reader)
        try:
            got = owners_by_gpu(source.read())
            info = source.describe()["pod_resources"]
        finally:
            source.close()
    train = {N.K8S_POD_NAME: "train-0", N.K8S_NAMESPACE: "team-a", N.K8S_CONTAINER_NAME: "trainer"}
    assert got == {FAKE_UUID.format(0, 0): train, FAKE_UUID.format(1, 1): train,
                   FAKE_UUID.format(2, 2): {N.K8S_POD_NAME: "notebook-7", N.K8S_NAMESPACE: "team-b",
                                            N.K8S_CONTAINER_NAME: "jupyter"},
                   FAKE_UUID.format(3, 3): {}}
    assert info["gpus_assigned_to_pods"] == 3 and info["problem"] == "-" and kubelet.calls >= 1


def test_a_kubelet_that_is_down_is_said_and_labels_follow_it_back():
    with Kubelet(fixture_response()) as kubelet:
        path = kubelet.path
        reader = PodResourcesReader(path, timeout_s=1.0)
        reader.refresh()
        assert len(reader.owners()) == 3
    reader.refresh()                         # the socket is gone: nothing guessed, the reason kept
    assert reader.owners() == {} and reader.failures == 1
    assert reader.problem.startswith(f"kubelet PodResources at {path}: UNAVAILABLE")


def test_the_agent_cli_labels_an_idle_gpu_from_the_kubelet():
    with Kubelet(fixture_response()) as kubelet:
        out = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", "--once", "--json", "--fake-gpus", "4",
                              "--no-live", "--kubelet-socket", kubelet.path], env=clean_env(), capture_output=True,
                             text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [r for r in json.loads(out.stdout) if r["name"] == N.GPU_UTILIZATION.name]
    pods = {r["attributes"][N.GPU_INDEX]: r["attributes"].get(N.K8S_CONTAINER_NAME) for r in rows}
    assert pods == {"0": "trainer", "1": "trainer", "2": "jupyter", "3": None}


def test_the_kubelet_socket_flag_refuses_what_is_not_a_socket(tmp_path):
    (tmp_path / "file").write_text("")
    for raw, said in ((str(tmp_path / "file"), "not a unix socket"), (str(tmp_path / "none"), "No such file"),
                      ("a\0b", "embedded null")):
        with pytest.raises(UsageError, match=said):
            kubelet_socket(raw)
    assert kubelet_socket("  ") is None
    with socket.socket(socket.AF_UNIX) as s:
        path = tempfile.mktemp(prefix="ks-", dir="/tmp")
        s.bind(path)
        try:
            assert kubelet_socket(f" {path} ") == path
        finally:
            os.unlink(path)
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", "--once", "--kubelet-socket",
                          str(tmp_path / "file")], env=clean_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "not a unix socket" in out.stderr


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=40))
def test_any_kubelet_socket_text_is_a_path_none_or_one_usage_error(raw):
    try:
        got = kubelet_socket(raw)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert got is None and not raw.strip()


NAMES = st.text(alphabet=string.ascii_lowercase + string.digits + "-", min_size=1, max_size=12)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(NAMES, NAMES, st.lists(st.tuples(NAMES, st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "rdma/hca", "example.com/fpga"]),
    st.lists(st.uuids().map(str), max_size=3)), max_size=3)), max_size=4))
def test_every_gpu_device_maps_to_its_container_and_nothing_else_does(pods):
    response = ListResponse(pod_resources=[
        Pod(name=name, namespace=ns, containers=[container(c, devices(res, *ids)) for c, res, ids in cs])
        for name, ns, cs in pods])
    got = gpu_owners(ListResponse.FromString(response.SerializeToString()))
    want = {}
    for name, ns, cs in pods:
        for c, res, ids in cs:
            if res.startswith("nvidia.com/"):
                for i in ids:
                    want.setdefault(i, ((N.K8S_POD_NAME, name), (N.K8S_NAMESPACE, ns), (N.K8S_CONTAINER_NAME, c)))
    assert got == want


POD = ((N.K8S_POD_NAME, "p"), (N.K8S_NAMESPACE, "ns"), (N.K8S_CONTAINER_NAME, "c"))


@given(st.sampled_from([(), ((N.SLURM_JOB_ID, "7"),), ((N.K8S_POD_UID, "u"),), ((N.K8S_POD_UID, "u"), (N.K8S_POD_NAME, "p")),
                        ((N.K8S_POD_NAME, "other"), (N.K8S_NAMESPACE, "ns"))]), st.booleans())
def test_the_assignment_completes_an_owner_and_never_overrides_another_pod(owner, assigned):
    got = with_assignment(owner, POD if assigned else None)
    if not assigned:
        assert got == owner
    elif not owner:
        assert got == POD
    elif dict(owner).get(N.K8S_POD_NAME, "p") != "p":
        assert got == owner                                  # what runs on the GPU wins
    else:
        assert dict(got) == {**dict(POD), **dict(owner)}     # the container (and pod name) added
        assert [k for k, _ in got] == [k for k in N.OWNER_ATTRIBUTES if k in dict(got)]


def test_doctor_shows_the_assignment_and_compares_each_pods_gpus():
    with Kubelet(fixture_response()) as kubelet:
        out = subprocess.run([sys.executable, "-m", "otel_gpu", "doctor", "--json", "--fake-gpus", "4",
                              "--kubelet-socket", kubelet.path], env=clean_env(), capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    nvml = json.loads(out.stdout)["sources"]["nvml"]
    assert nvml["pod_resources"]["gpus_assigned_to_pods"] == 3 and nvml["pod_resources"]["problem"] == "-"
    assert nvml["gpus_alike"].startswith("yes: 4 GPUs alike")   # the node's, and train-0's two
