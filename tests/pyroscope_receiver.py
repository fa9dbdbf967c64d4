"""A small Pyroscope push receiver for tests: decodes what the real pyroscope-io agent sends.

`POST /push.v1.PusherService/Push` carries a gzip'd protobuf `push.v1.PushRequest`
whose samples hold uncompressed pprof `Profile`s. Decoded with a hand-written
protobuf reader (the schema parts used are small). Modes for failure tests:
"ok" (200), "error" (HTTP 500), "hang" (accept, never answer).
"""
from __future__ import annotations

import gzip
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PUSH_PATH = "/push.v1.PusherService/Push"


# ---- protobuf wire format -------------------------------------------------------
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(buf: bytes):
    """Yield (field number, wire type, value) of one message; value is int or bytes."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            value, i = _varint(buf, i)
        elif wt == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wt == 1:
            value, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wt == 5:
            value, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise ValueError(f"unsupported wire type {wt}")
        yield num, wt, value


def _ints(wt: int, value) -> list[int]:
    """A repeated integer field, packed (bytes) or not (one int)."""
    if wt == 0:
        return [value]
    out, i = [], 0
    while i < len(value):
        v, i = _varint(value, i)
        out.append(v)
    return out


# ---- pprof ----------------------------------------------------------------------
@dataclass
class Sample:
    stack: list[str]            # function names, leaf first
    value: int                  # nanoseconds (cpu / wall)
    labels: dict[str, str]


@dataclass
class Profile:
    series: dict[str, str]      # series labels (from configure(): service_name, job, rank ...)
    sample_types: list[tuple[str, str]]
    period: int
    samples: list[Sample] = field(default_factory=list)


def parse_pprof(buf: bytes, series: dict[str, str]) -> Profile:
    strings: list[str] = []
    functions: dict[int, int] = {}          # function id -> name string index
    locations: dict[int, list[int]] = {}    # location id -> function ids (inlined first)
    raw_samples, sample_types, period = [], [], 0
    for num, wt, value in fields(buf):
        if num == 6:
            strings.append(value.decode("utf-8", "replace"))
        elif num == 5:
            f = {n: v for n, _, v in fields(value)}
            functions[f.get(1, 0)] = f.get(2, 0)
        elif num == 4:
            loc_id, funcs = 0, []
            for n, _, v in fields(value):
                if n == 1:
                    loc_id = v
                elif n == 4:
                    funcs.append({ln: lv for ln, _, lv in fields(v)}.get(1, 0))
            locations[loc_id] = funcs
        elif num == 2:
            raw_samples.append(value)
        elif num == 1:
            t = {n: v for n, _, v in fields(value)}
            sample_types.append((t.get(1, 0), t.get(2, 0)))
        elif num == 12:
            period = value
    prof = Profile(series, [(strings[a], strings[b]) for a, b in sample_types], period)
    for raw in raw_samples:
        loc_ids, values, labels = [], [], {}
        for n, wt, v in fields(raw):
            if n == 1:
                loc_ids += _ints(wt, v)
            elif n == 2:
                values += _ints(wt, v)
            elif n == 3:
                lab = {ln: lv for ln, _, lv in fields(v)}
                labels[strings[lab.get(1, 0)]] = strings[lab.get(2, 0)]
        stack = [strings[functions[f]] for loc in loc_ids for f in locations.get(loc, [])]
        prof.samples.append(Sample(stack, values[0] if values else 0, labels))
    return prof


def parse_push(body: bytes) -> list[Profile]:
    """A PushRequest body (gzip'd or not) -> its profiles."""
    if body[:2] == b"\x1f\x8b":
        body = gzip.decompress(body)
    out = []
    for num, _, series in fields(body):
        if num != 1:
            continue
        labels, raws = {}, []
        for n, _, v in fields(series):
            if n == 1:
                pair = {ln: lv for ln, _, lv in fields(v)}
                labels[pair.get(1, b"").decode()] = pair.get(2, b"").decode()
            elif n == 2:
                raws += [rv for rn, _, rv in fields(v) if rn == 1]
        out += [parse_pprof(raw, labels) for raw in raws]
    return out


# ---- the server -----------------------------------------------------------------
class Receiver:
    """Pyroscope stand-in on 127.0.0.1:<port>; `profiles` collects what was pushed."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.profiles: list[Profile] = []
        self.bodies: list[bytes] = []   # every push body as received
        self.requests = 0
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.requests += 1
                if receiver.mode == "hang":
                    receiver._release.wait(120)
                    return
                if receiver.mode == "error":
                    self.send_response(500)
                    self.end_headers()
                    return
                if self.path == PUSH_PATH:
                    receiver.bodies.append(body)
                    receiver.profiles += parse_push(body)
                self.send_response(200)
                self.send_header("content-type", "application/proto")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    # ---- queries over what was received ----
    def weight(self, where=lambda s: True) -> dict[str, int]:
        """Self+children value per function name over samples matching `where` (ns)."""
        out: dict[str, int] = defaultdict(int)
        for p in self.profiles:
            for s in p.samples:
                if where(s):
                    for fn in set(s.stack):
                        out[fn] += s.value
        return dict(out)

    def total(self, where=lambda s: True) -> int:
        return sum(s.value for p in self.profiles for s in p.samples if where(s))
