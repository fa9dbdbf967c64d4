"""PyTorch Flight Recorder dumps -> GPU-timed collective records (pure: no torch import).

ProcessGroupNCCL records every collective in a process-wide ring buffer (the Flight Recorder).
With timing on (`TORCH_NCCL_ENABLE_TIMING=1`) each entry gets, once the watchdog has seen it
complete ("retired"), `duration_ms`: the GPU time between CUDA events recorded on the NCCL stream
before and after the collective's kernel. That time includes waiting for the last rank to arrive.
Entries are keyed the same on every rank by (process group, `collective_seq_id`).

A dump is a JSON document or a pickle of plain values (`_dump_nccl_trace*`, `_dump_fr_trace*`,
format "2.x"): `{"version", "pg_config", "pg_status", "entries": [...]}`. `Cursor` turns
successive dumps into the records not seen before, and counts what could not be measured:
records overwritten before a poll saw them complete (ring overflow), records without a duration
(timing off, or a backend that does not time: gloo).

A dump is read within bounds: at most MAX_DUMP_BYTES and MAX_ENTRIES entries, nesting that would
exhaust the decoder's recursion is refused in one line, and an entry whose duration is not a
number from 0 to 1e12 ms gets none (that collective counts as not timed; the rest of the dump is read).
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass, replace
from typing import Iterable, Optional

import msgspec

# Flight Recorder operation name (after "nccl:" / "gloo:" ...) -> the collective kind we report
KINDS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce", "all_reduce_barrier": "barrier", "barrier": "barrier",
    "all_gather": "all_gather", "allgather": "all_gather", "_allgather_base": "all_gather", "_all_gather_base": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast", "_broadcast_oop": "broadcast", "reduce": "reduce", "_reduce_oop": "reduce",
    "all_to_all": "all_to_all", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "gather": "gather", "scatter": "scatter", "send": "send", "recv": "recv",
    "coalesced": "coalesced",
}
# reasons a collective was not measured (the `otelgpu.reason` attribute of the unmeasured counter)
UNTIMED = "timing_off"          # retired without a duration: timing was off, or the backend does not time
OVERFLOW = "ring_overflow"      # overwritten in the ring before a poll saw it retired
REASONS = (UNTIMED, OVERFLOW)


class FlightRecorderError(ValueError):
    """A dump that is not a Flight Recorder dump: one line for the user."""


@dataclass(frozen=True)
class Record:
    """One collective of one rank; times in seconds (GPU time), `created_ns` host unix nanoseconds."""
    record_id: int
    pg: str                  # process group name (its id as a string, "0" for the default group)
    pg_desc: str             # "default_pg", "undefined", a user's group_desc
    seq: int                 # collective_seq_id (p2p_seq_id for point-to-point): same on every rank
    kind: str                # all_reduce, all_gather, reduce_scatter, ... (KINDS), else the raw name
    state: str               # scheduled | started | completed
    retired: bool | None     # None: a format without the flag
    duration_s: float | None
    created_ns: int
    p2p: bool = False

    @property
    def final(self) -> bool:
        """Nothing more will be learned about it: retired, or (formats without the flag) completed."""
        if self.retired is not None:
            return self.retired or (self.state == "completed" and self.duration_s is not None)
        return self.state == "completed"

    @property
    def group(self) -> str:
        """The process group as shown to users: its description when it has one, else its name."""
        return self.pg_desc if self.pg_desc and self.pg_desc != "undefined" else self.pg


def kind_of(profiling_name: str) -> str:
    """'nccl:_allgather_base' -> 'all_gather'; an unknown operation keeps its own name."""
    op = profiling_name.split(":", 1)[-1].strip()
    return KINDS.get(op, op or "unknown")


class _PlainUnpickler(pickle.Unpickler):
    """A Flight Recorder pickle holds dicts, lists, tuples, strings and numbers only: refuse any class."""

    def find_class(self, module, name):
        raise FlightRecorderError(f"not a Flight Recorder dump: the pickle names {module}.{name}")


MAX_DUMP_BYTES = 32 << 20   # a dump's JSON or pickle: a ring of ~100,000 entries
MAX_ENTRIES = 100_000
Duration = float            # milliseconds; out of [0, 1e12) (or NaN): no duration (see `_record`)


class _Entry(msgspec.Struct):
    """The fields of a dump entry we read (others are ignored): every format from "2.2" on."""
    record_id: int
    process_group: Optional[tuple[str, str]] = None
    pg_id: int = 0
    collective_seq_id: int = 0
    p2p_seq_id: int = 0
    profiling_name: str = ""
    state: str = ""
    retired: Optional[bool] = None
    duration_ms: Optional[Duration] = None
    time_created_ns: int = 0
    is_p2p: bool = False


class _Dump(msgspec.Struct):
    version: str = ""
    entries: Optional[list[_Entry]] = None


_json = msgspec.json.Decoder(_Dump)


def _decode(data: bytes | str | dict) -> _Dump:
    if isinstance(data, (bytes, bytearray, str)) and len(data) > MAX_DUMP_BYTES:
        raise FlightRecorderError(f"Flight Recorder dump not read: {len(data) >> 20} MiB is over its bound of "
                                  f"{MAX_DUMP_BYTES >> 20} MiB (a smaller TORCH_NCCL_TRACE_BUFFER_SIZE keeps it under)")
    if isinstance(data, (bytes, bytearray)) and data[:1] == b"\x80":
        try:
            data = _PlainUnpickler(io.BytesIO(bytes(data))).load()
        except FlightRecorderError:
            raise
        except Exception as exc:
            raise FlightRecorderError(f"not a Flight Recorder dump: unreadable pickle ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("entries"), list) and len(data["entries"]) > MAX_ENTRIES:
        raise FlightRecorderError(f"Flight Recorder dump not read: {len(data['entries']):,} entries is over its bound "
                                  f"of {MAX_ENTRIES:,}")
    try:
        if isinstance(data, (bytes, bytearray, str)):
            return _json.decode(data)
        return msgspec.convert(data, _Dump)
    except msgspec.ValidationError as exc:
        raise FlightRecorderError(f"not a Flight Recorder dump: {exc}") from None
    except msgspec.DecodeError as exc:
        raise FlightRecorderError(f"not a Flight Recorder dump: invalid JSON ({exc})") from None
    except RecursionError:
        raise FlightRecorderError("not a Flight Recorder dump: values nested too deep to read") from None


def _record(e: _Entry) -> Record:
    name, desc = e.process_group if e.process_group is not None else (str(e.pg_id), "")
    return Record(record_id=e.record_id, pg=name, pg_desc=desc, seq=e.p2p_seq_id if e.is_p2p else e.collective_seq_id,
                  kind=kind_of(e.profiling_name), state=e.state, retired=e.retired,
                  duration_s=e.duration_ms / 1000.0 if e.duration_ms is not None and 0 <= e.duration_ms < 1e12 else None,
                  created_ns=e.time_created_ns, p2p=e.is_p2p)


def parse(data: bytes | str | dict, min_id: int | None = None) -> tuple[str, list[Record]]:
    """A dump (JSON text or bytes, pickle bytes, or a decoded dict) -> (format version, records in
    record-id order); FlightRecorderError with one line naming what is wrong. With `min_id` (a
    cursor's `next_id`), records below it are skipped (read before), unless the ids restarted."""
    d = _decode(data)
    entries = d.entries or ()
    if len(entries) > MAX_ENTRIES:
        raise FlightRecorderError(f"Flight Recorder dump not read: {len(entries):,} entries is over its bound of "
                                  f"{MAX_ENTRIES:,}")
    if min_id is not None and entries and max(e.record_id for e in entries) >= min_id - 1:
        entries = [e for e in entries if e.record_id >= min_id]
    return d.version, sorted((_record(e) for e in entries), key=lambda r: r.record_id)


def last_seqs(recs: Iterable[Record]) -> dict[tuple[str, str], int]:
    """(process group as shown, "started" | "completed") -> the collective sequence number of the newest
    record (by record id) that has got that far (a completed one has started too). Point-to-point
    operations are left out: their numbers count apart and only between two ranks."""
    out: dict[tuple[str, str], int] = {}
    for r in sorted(recs, key=lambda r: r.record_id):
        if r.p2p or r.state not in ("started", "completed"):
            continue
        out[(r.group, "started")] = r.seq
        if r.state == "completed":
            out[(r.group, "completed")] = r.seq
    return out


@dataclass
class Poll:
    """What one dump added: records newly final with their GPU duration, and counts not measured."""
    timed: list[Record]
    unmeasured: dict[str, int]


class Cursor:
    """Successive dumps of one process -> each final record exactly once.

    Record ids grow by one per collective across all process groups (a reset starts them again: the
    cursor starts over). Members of a coalesced group are timed together by the group's closing
    "coalesced" record, which takes their kind when they share one. `next_id` is the lowest id not
    yet final; final records above it (some before it still in flight) are remembered in `done`.
    Ids below the oldest entry of a dump that were never seen final were overwritten in the ring
    between two polls: counted as `ring_overflow`. A final record without a duration counts as
    `timing_off`.
    """

    def __init__(self) -> None:
        self.next_id: int | None = None
        self.done: set[int] = set()

    def update(self, recs: Iterable[Record], since_ns: int = 0) -> Poll:
        """Records of one dump (any order). Records created before `since_ns` (host unix ns) are
        consumed without being reported (collectives of set-up, before the first step)."""
        recs = sorted(recs, key=lambda r: r.record_id)
        timed: list[Record] = []
        lost = {UNTIMED: 0, OVERFLOW: 0}
        if not recs:
            return Poll(timed, {})
        if self.next_id is not None and recs[-1].record_id < self.next_id - 1:   # ids restarted (a new epoch)
            self.next_id, self.done = None, set()
        if self.next_id is None:
            self.next_id = recs[0].record_id
        # a coalesced group: its members share the seq id of a closing "coalesced" record, which alone is timed
        members: dict[tuple[str, int], set[str]] = {}
        for r in recs:
            if r.kind != "coalesced" and not r.p2p:
                members.setdefault((r.pg, r.seq), set()).add(r.kind)
        closed = {(r.pg, r.seq) for r in recs if r.kind == "coalesced"}
        oldest = recs[0].record_id
        if oldest > self.next_id:   # ids [next_id, oldest) left the ring; those not yet final were lost
            gone = [i for i in self.done if i < oldest]
            missed = oldest - self.next_id - len(gone)
            lost[OVERFLOW] += max(0, missed)
            self.done.difference_update(gone)
            self.next_id = oldest
        for r in recs:
            if r.record_id < self.next_id or r.record_id in self.done or not r.final:
                continue
            self.done.add(r.record_id)
            if r.created_ns < since_ns:
                continue
            if r.duration_s is None:
                if (r.pg, r.seq) not in closed or r.kind == "coalesced":   # a member's time is its group's
                    lost[UNTIMED] += 1
            elif r.kind == "coalesced" and len(members.get((r.pg, r.seq), ())) == 1:
                timed.append(replace(r, kind=next(iter(members[(r.pg, r.seq)]))))
            else:
                timed.append(r)
        while self.next_id in self.done:   # advance over the contiguous final prefix
            self.done.discard(self.next_id)
            self.next_id += 1
        return Poll(timed, {k: v for k, v in lost.items() if v})
