"""The kubelet's PodResources API (v1 `List` over its unix socket): which pod and container each GPU is
assigned to, so a GPU a pod holds while no process runs on it still carries its pod, and a busy GPU
gains `k8s.container.name` (a process's cgroup path names the pod, not the container).

The messages are built from their descriptors here (the fields of k8s.io/kubelet's
pkg/apis/podresources/v1/api.proto this reader uses; the others are skipped when parsing), so no
generated code is needed. `gpu_owners` is the pure part: a `ListPodResourcesResponse` in, GPU UUID ->
owner attribute items out. `PodResourcesReader` asks the kubelet every `refresh_s` seconds on a thread
of its own (a slow kubelet never stalls a sampling round), each answer bounded in size and time.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from .. import names as N
from .gpu_owner import Owner, clean

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_ANSWER_BYTES = 8 << 20      # a node's pods: KBs; anything near this is not a kubelet's answer
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/mig-")   # device plugin resource names (MIG: mixed strategy)


def _messages() -> dict[str, type]:
    f = descriptor_pb2.FileDescriptorProto(name="otelgpu_podresources_v1.proto", package="v1", syntax="proto3")
    rep, opt = descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED, descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    string, msg = descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
    layout = {
        "ListPodResourcesRequest": [],
        "ListPodResourcesResponse": [("pod_resources", 1, rep, msg, ".v1.PodResources")],
        "PodResources": [("name", 1, opt, string, None), ("namespace", 2, opt, string, None),
                         ("containers", 3, rep, msg, ".v1.ContainerResources")],
        "ContainerResources": [("name", 1, opt, string, None), ("devices", 2, rep, msg, ".v1.ContainerDevices")],
        "ContainerDevices": [("resource_name", 1, opt, string, None), ("device_ids", 2, rep, string, None)],
    }
    for name, fields in layout.items():
        m = f.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            field = m.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}")) for name in layout}


MESSAGES = _messages()
ListRequest, ListResponse = MESSAGES["ListPodResourcesRequest"], MESSAGES["ListPodResourcesResponse"]


def gpu_owners(response) -> dict[str, Owner]:
    """GPU (or MIG device) UUID -> ((k8s.pod.name, ..), (k8s.namespace.name, ..), (k8s.container.name, ..))
    for every GPU device a container is assigned; text cleaned and bounded as the cgroup owners' is.
    A device listed for two containers (not something the kubelet does) keeps the first."""
    out: dict[str, Owner] = {}
    for pod in response.pod_resources:
        for c in pod.containers:
            owner = tuple((k, v) for k, v in ((N.K8S_POD_NAME, clean(pod.name)), (N.K8S_NAMESPACE, clean(pod.namespace)),
                                               (N.K8S_CONTAINER_NAME, clean(c.name))) if v)
            for d in c.devices:
                if d.resource_name.startswith(GPU_RESOURCES):
                    for uuid in d.device_ids:
                        out.setdefault(clean(uuid) or "", owner)
    out.pop("", None)
    return out


def list_owners(socket_path: str, timeout_s: float = 2.0) -> dict[str, Owner]:
    """One `List` call to the kubelet at `socket_path`; raises grpc.RpcError (or OSError) on failure."""
    options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), ("grpc.enable_http_proxy", 0)]
    with grpc.insecure_channel(f"unix://{socket_path}", options=options) as channel:
        call = channel.unary_unary(LIST_METHOD, request_serializer=ListRequest.SerializeToString,
                                   response_deserializer=ListResponse.FromString)
        return gpu_owners(call(ListRequest(), timeout=timeout_s))


class PodResourcesReader:
    """`owners()`: the latest GPU -> pod map (empty until the first answer, and after a failed one, which
    `problem` then names). `start()` refreshes it every `refresh_s` seconds on a daemon thread; `refresh()`
    does one now."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, refresh_s: float = 10.0, timeout_s: float = 2.0,
                 lister: Callable[[str, float], dict[str, Owner]] = list_owners):
        self.socket_path, self.refresh_s, self.timeout_s, self._list = socket_path, refresh_s, timeout_s, lister
        self._owners: dict[str, Owner] = {}
        self.problem: str | None = None
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def owners(self) -> dict[str, Owner]:
        return self._owners

    def refresh(self) -> None:
        try:
            self._owners, self.problem = self._list(self.socket_path, self.timeout_s), None
        except grpc.RpcError as err:
            self._owners, self.failures = {}, self.failures + 1
            code = err.code() if callable(getattr(err, "code", None)) else None
            detail = err.details() if callable(getattr(err, "details", None)) else ""
            self.problem = f"kubelet PodResources at {self.socket_path}: {code.name if code else 'error'}: " \
                           f"{' '.join(str(detail).split())[:160]}"

    def start(self) -> "PodResourcesReader":
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="otelgpu-podresources", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1)

    def describe(self) -> dict:
        """doctor: where it reads, what it holds, what failed."""
        return {"kubelet_socket": self.socket_path, "gpus_assigned_to_pods": len(self._owners),
                "problem": self.problem or "-", "failed_lists": self.failures, "at": round(time.time())}
