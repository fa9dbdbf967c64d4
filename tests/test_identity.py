"""Node, job and rank identity from launcher environments; OTLP settings from OTEL_* variables."""
import uuid

import pytest
from hypothesis import given, strategies as st

from otel_gpu.errors import ConfigError
from otel_gpu.export import otlp_settings
from otel_gpu.identity import _NAMESPACE, uuid5, instance_id, job_name, point_attributes, rank_info, resource_attributes


def test_torchrun_rank_variables():
    env = {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "run-42"}
    assert rank_info(env) == {"otelgpu.rank": "3", "otelgpu.local_rank": "1", "otelgpu.world_size": "8"}
    assert job_name(env) == "run-42"


def test_slurm_variables_when_the_launcher_sets_only_those():
    env = {"SLURM_PROCID": "17", "SLURM_LOCALID": "1", "SLURM_NTASKS": "32", "SLURM_JOB_NAME": "scout",
           "SLURM_JOB_ID": "991", "SLURM_CLUSTER_NAME": "h100a", "TORCHELASTIC_RUN_ID": "none"}
    assert rank_info(env) == {"otelgpu.rank": "17", "otelgpu.local_rank": "1", "otelgpu.world_size": "32"}
    attrs = resource_attributes(env, host="node-07")
    assert attrs["otelgpu.job"] == "scout" and attrs["slurm.job.id"] == "991"
    assert attrs["slurm.cluster.name"] == "h100a" and attrs["host.name"] == "node-07"


def test_explicit_job_wins_and_torchelastic_none_is_ignored():
    assert job_name({"OTELGPU_JOB": "mine", "SLURM_JOB_NAME": "x"}) == "mine"
    assert job_name({"TORCHELASTIC_RUN_ID": "none"}) is None


def test_kubernetes_downward_api():
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "train-0", "POD_NAMESPACE": "ml", "NODE_NAME": "gpu-3"}
    attrs = resource_attributes(env, host="train-0")
    assert attrs["k8s.pod.name"] == "train-0" and attrs["k8s.namespace.name"] == "ml"
    assert attrs["k8s.node.name"] == "gpu-3"


def test_instance_id_is_stable_per_node_and_differs_between_nodes(tmp_path):
    mid = tmp_path / "machine-id"
    mid.write_text("0123456789abcdef\n")
    assert instance_id("a", mid) == instance_id("a", mid)
    assert instance_id("a", mid) != instance_id("b", mid)
    assert instance_id("a", tmp_path / "missing") == instance_id("a", tmp_path / "missing")


def test_point_attributes_carry_node_and_job_only():
    assert point_attributes({"host.name": "n1", "otelgpu.job": "j", "service.name": "s"}) == {"host.name": "n1", "otelgpu.job": "j"}


def test_otlp_settings_defaults_and_validation():
    s = otlp_settings({}, default_interval_s=10)
    assert (s.endpoint, s.protocol, s.interval_s) == (None, "http/protobuf", 10)
    s = otlp_settings({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                       "OTEL_METRIC_EXPORT_INTERVAL": "2500"}, default_interval_s=10)
    assert (s.endpoint, s.protocol, s.interval_s) == ("http://c:4317", "grpc", 2.5)
    for env in ({"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"},
                {"OTEL_METRIC_EXPORT_INTERVAL": "0"}, {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"}):
        with pytest.raises(ConfigError):
            otlp_settings(env, default_interval_s=10)


@given(st.text(), st.uuids())
def test_uuid5_is_the_standard_librarys(name, namespace):
    """The agent's UUIDv5 (built-in SHA-1, no OpenSSL) is `uuid.uuid5`'s for any name."""
    assert uuid5(namespace, name) == uuid.uuid5(namespace, name)
    assert uuid5(_NAMESPACE, name) == uuid.uuid5(_NAMESPACE, name)
