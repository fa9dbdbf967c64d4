"""Message classes for pprof profiles and Pyroscope push bodies, from the compiled schemas in proto/.

The schemas ship as a `FileDescriptorSet` (proto/schemas.desc, built from proto/*.proto) and are
turned into classes by the protobuf library at import: no generated code, no hand-written decoder.
"""
from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMAS = Path(__file__).resolve().parent / "proto" / "schemas.desc"


def _classes() -> dict[str, type]:
    pool = descriptor_pool.DescriptorPool()
    fds = descriptor_pb2.FileDescriptorSet.FromString(SCHEMAS.read_bytes())
    for f in fds.file:
        pool.Add(f)
    names = ("otelgpu.pprof.Profile", "otelgpu.push.PushRequest")
    return {n.rsplit(".", 1)[1]: message_factory.GetMessageClass(pool.FindMessageTypeByName(n)) for n in names}


_C = _classes()
Profile = _C["Profile"]          # pprof Profile
PushRequest = _C["PushRequest"]  # Pyroscope push.v1.PushRequest
