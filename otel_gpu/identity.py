"""Who is reporting: node, job and rank identity from the environment (pure functions).

The node agent and every training rank on a node share `host.name` and
`service.instance.id`, so their series join in PromQL.
"""
from __future__ import annotations

import re
import socket
import uuid
from pathlib import Path
from typing import Mapping

_NAMESPACE = uuid.UUID("5f0c6a53-2b1e-4c55-9d0e-6f7a0c6b1e42")

# First variable present wins.
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")
_WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
_JOB_VARS = ("OTELGPU_JOB", "SLURM_JOB_NAME", "TORCHELASTIC_RUN_ID")


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = env.get(name, "").strip()
        if value and value.lower() != "none":
            return value
    return None


def rank_info(env: Mapping[str, str]) -> dict[str, str]:
    """`otelgpu.rank`, `otelgpu.local_rank`, `otelgpu.world_size` where the launcher set them."""
    out = {}
    for key, names in (("otelgpu.rank", _RANK_VARS), ("otelgpu.local_rank", _LOCAL_RANK_VARS),
                       ("otelgpu.world_size", _WORLD_SIZE_VARS)):
        value = _first(env, names)
        if value is not None:
            out[key] = value
    return out


def job_name(env: Mapping[str, str]) -> str | None:
    """The job: `OTELGPU_JOB`, else Slurm's job name, else torchelastic's run id."""
    return _first(env, _JOB_VARS)


FOLDER_NAME_MAX = 80   # characters of a job name kept in a folder name


def job_folder_name(job: str) -> str:
    """A job name as one safe folder-name component (pure): every run of characters other than
    [A-Za-z0-9_.-] becomes '-', no leading dot or dash, at most FOLDER_NAME_MAX characters, never
    empty, '.' or '..' ("run" then). The job name itself (on metrics, in reports) is unchanged."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", job)[:FOLDER_NAME_MAX].lstrip(".-").rstrip("-")
    return name if name.strip(".") else "run"


def instance_id(host: str, machine_id_path: Path = Path("/etc/machine-id")) -> str:
    """A stable `service.instance.id` for this node: UUIDv5 of the machine id (or host name)."""
    try:
        seed = machine_id_path.read_text().strip() or host
    except OSError:
        seed = host
    return str(uuid5(_NAMESPACE, f"{seed}/{host}"))


def uuid5(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """`uuid.uuid5`, hashed by the interpreter's own SHA-1 where it has one: `hashlib` loads OpenSSL's
    libcrypto (~3.7 MB of resident memory in the node agent) for this one digest."""
    try:
        from _sha1 import sha1
    except ImportError:   # an interpreter built without it
        from hashlib import sha1
    digest = sha1(namespace.bytes + name.encode("utf-8")).digest()
    return uuid.UUID(bytes=digest[:16], version=5)


def resource_attributes(env: Mapping[str, str], host: str | None = None,
                        machine_id_path: Path = Path("/etc/machine-id")) -> dict[str, str]:
    """Resource attributes from the launcher environment (Slurm, Kubernetes).

    `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME` are merged on top by the SDK,
    so a user's own values always win.
    """
    host = host or socket.gethostname()
    attrs = {"host.name": host, "service.instance.id": instance_id(host, machine_id_path)}
    job = job_name(env)
    if job:
        attrs["otelgpu.job"] = job
    slurm = {"slurm.job.id": "SLURM_JOB_ID", "slurm.cluster.name": "SLURM_CLUSTER_NAME",
             "slurm.node.list": "SLURM_JOB_NODELIST"}
    k8s = {"k8s.pod.name": "POD_NAME", "k8s.namespace.name": "POD_NAMESPACE", "k8s.node.name": "NODE_NAME"}
    for key, var in {**slurm, **k8s}.items():
        if env.get(var):
            attrs[key] = env[var]
    if env.get("KUBERNETES_SERVICE_HOST") and "k8s.pod.name" not in attrs and env.get("HOSTNAME"):
        attrs["k8s.pod.name"] = env["HOSTNAME"]
    return attrs


def point_attributes(resource: Mapping[str, str]) -> dict[str, str]:
    """Identity copied onto every data point (`host.name`, `otelgpu.job`).

    A Prometheus scrape keeps resource attributes only in `target_info`; copying
    these two makes every backend's series joinable by node and job without a join.
    """
    return {k: resource[k] for k in ("host.name", "otelgpu.job") if resource.get(k)}
