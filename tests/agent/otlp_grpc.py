"""A real OTLP/gRPC metrics receiver on loopback, for tests: the protocol's own service
definition (opentelemetry-proto) served by grpcio, keeping every request it gets."""
from __future__ import annotations

import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as pb
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as pb_grpc


class _Service(pb_grpc.MetricsServiceServicer):
    def __init__(self, receiver: "GrpcReceiver"):
        self._receiver = receiver

    def Export(self, request, context):
        with self._receiver.lock:
            self._receiver.requests.append(request)
        return pb.ExportMetricsServiceResponse()


class GrpcReceiver:
    """`requests`: every ExportMetricsServiceRequest received, in order."""

    def __init__(self):
        self.requests: list = []
        self.lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_MetricsServiceServicer_to_server(_Service(self), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)

    def metric_names(self) -> set[str]:
        with self.lock:
            return {m.name for r in self.requests for rm in r.resource_metrics
                    for sm in rm.scope_metrics for m in sm.metrics}

    def points(self, name: str) -> list[tuple[dict, dict, float]]:
        """(resource attributes, point attributes, value) of every data point of `name`, oldest first."""
        out = []
        with self.lock:
            for r in self.requests:
                for rm in r.resource_metrics:
                    resource = {a.key: a.value.string_value for a in rm.resource.attributes}
                    for sm in rm.scope_metrics:
                        for m in sm.metrics:
                            if m.name != name:
                                continue
                            data = getattr(m, m.WhichOneof("data"))
                            for p in data.data_points:
                                attrs = {a.key: a.value.string_value for a in p.attributes}
                                value = p.as_double if p.HasField("as_double") else float(p.as_int)
                                out.append((resource, attrs, value))
        return out
