"""Run by `otel-gpu run` as its command: attacks the run's own receiver, then prints, one per line,
`name status` for each attack and `peak KB` (the run's VmHWM, read from /proc/<parent>/status).

The run's key comes from the environment (what a hostile rank would have); the attacks without it
come first. Bodies are made by hand on the wire where the SDK would refuse to make them.
"""
from __future__ import annotations

import gzip
import http.client
import os
import socket
import struct
import threading
import time
import zlib
from urllib.parse import urlparse

from otel_gpu.profiling import RECORD_KEY_HEADER, RECORD_KEY_VAR
from otel_gpu.record import protos

URL = urlparse(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"))
KEY = os.environ.get(RECORD_KEY_VAR, "")
BOMB = 512 << 20   # bytes of zeros inside the gzip bombs (the deflate bomb: 64 MiB)


def post(path: str, body: bytes, headers: dict | None = None, key: bool = True) -> int:
    conn = http.client.HTTPConnection(URL.hostname, URL.port, timeout=60)
    try:
        h = {"content-type": "application/x-protobuf", **(headers or {})}
        if key:
            h[RECORD_KEY_HEADER] = KEY
        conn.request("POST", path, body=body, headers=h)
        return conn.getresponse().status
    except ConnectionError:
        return -1
    finally:
        conn.close()


def ld(field: int, payload: bytes) -> bytes:
    """One length-delimited field on the wire."""
    out, n = bytearray([field << 3 | 2]), len(payload)
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + payload


def otlp(points: bytes, name: bytes = b"m") -> bytes:
    """An ExportMetricsServiceRequest of one gauge holding `points` (NumberDataPoint fields)."""
    return ld(1, ld(2, ld(2, ld(1, name) + ld(5, points))))


def point(attrs: dict[str, str], value: float = 1.0) -> bytes:
    """One NumberDataPoint as a Gauge/Sum `data_points` field: attributes, time now, as_double."""
    kvs = b"".join(ld(7, ld(1, k.encode()) + ld(2, ld(1, v.encode()))) for k, v in attrs.items())
    return ld(1, kvs + b"\x19" + struct.pack("<Q", time.time_ns()) + b"\x21" + struct.pack("<d", value))


def steps_point(n: float) -> bytes:
    """A cumulative monotonic sum `otelgpu.train.steps` of rank 0 at `n`."""
    total = point({"otelgpu.rank": "0"}, n) + b"\x10\x02\x18\x01"
    return ld(1, ld(2, ld(2, ld(1, b"otelgpu.train.steps") + ld(7, total))))


def deep_profile(depth: int) -> bytes:
    p = protos.Profile()
    p.string_table.extend(["", "recurse", "wall", "nanoseconds"])
    p.function.add(id=1, name=1)
    p.location.add(id=1).line.add(function_id=1)
    p.sample_type.add(type=2, unit=3)
    p.sample.add(location_id=[1] * depth, value=[1])
    return p.SerializeToString()


def push(profile: bytes) -> bytes:
    req = protos.PushRequest()
    s = req.series.add()
    s.labels.add(name="service_name", value="attack")
    s.samples.add(raw_profile=profile)
    return req.SerializeToString()


def reset_mid_body() -> int:
    s = socket.create_connection((URL.hostname, URL.port))
    s.sendall(f"POST /v1/metrics HTTP/1.1\r\nhost: x\r\n{RECORD_KEY_HEADER}: {KEY}\r\ncontent-length: 1000\r\n\r\n".encode()
              + b"\0" * 10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))   # close with RST
    s.close()
    return 0


def simultaneous(n: int) -> int:
    """n requests at once; returns how many were not answered 200."""
    body = otlp(point({"k": "v"}))
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(post("/v1/metrics", body))) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(1 for r in results if r != 200)


def main() -> None:
    mib = gzip.compress(b"\0" * (1 << 20), 9)
    gz = mib * (BOMB >> 20)   # gzip members one after another: one stream of BOMB zeros
    zl = zlib.compress(b"\0" * (64 << 20), 1)
    many = otlp(b"".join(point({"s": str(i)}) for i in range(45_000)), b"series.flood")
    attacks = [
        ("forged_steps_without_key", lambda: post("/v1/metrics", steps_point(1e18), key=False)),
        ("gzip_bomb", lambda: post("/v1/metrics", gz, {"content-encoding": "gzip"})),
        ("deflate_bomb", lambda: post("/v1/metrics", zl, {"content-encoding": "deflate"})),
        ("profile_bomb", lambda: post("/push.v1.PusherService/Push", push(gz))),
        ("deep_stack", lambda: post("/push.v1.PusherService/Push", push(deep_profile(100_000)))),
        ("million_points", lambda: post("/v1/metrics", otlp(b"\x0a\x00" * 1_000_000))),
        ("oversized_body", lambda: post("/v1/metrics", b"\0" * (9 << 20))),
        ("series_flood", lambda: post("/v1/metrics", many)),
        ("reset_mid_body", reset_mid_body),
        ("simultaneous_64_not_200", lambda: simultaneous(64)),
    ]
    for name, attack in attacks:
        print(name, attack(), flush=True)
    print("peak", peak(), flush=True)


def peak() -> int:
    """The run's peak resident memory so far (VmHWM), in KiB."""
    with open(f"/proc/{os.getppid()}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("VmHWM:")))


if __name__ == "__main__":
    main()
