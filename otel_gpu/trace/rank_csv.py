"""The per-rank CSV files (queue-length and memory-bandwidth time series, launch pairs), made where
the rank is analysed (a worker process on large sets) and kept zlib-compressed until written: the
main process neither recomputes the series nor holds every rank's text at once."""
from __future__ import annotations

import csv
import io
import zlib

from . import counters

PAIR_COLUMNS = ("correlation", "cpu_duration", "gpu_duration", "launch_delay")


def series_csv(columns: tuple[str, ...], rows) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    w.writerows(rows)
    return buf.getvalue()


def pairs_csv(pairs: dict) -> str:
    """Every launch paired with its GPU event: correlation, cpu/gpu duration, launch delay (us)."""
    lines = map(",".join, zip(*(map(repr, pairs[c].tolist()) for c in PAIR_COLUMNS)))  # C-level loops
    body = "\n".join(lines)
    return ",".join(PAIR_COLUMNS) + "\n" + (body + "\n" if body else "")


def rank_files(v, pairs: dict) -> dict[str, list[tuple[str, bytes]]]:
    """The rank's series and launch-pair files: {"series": [(name, packed)], "pairs": [(name, packed)]}."""
    queue = series_csv(("ts", "stream", "queue_length"),
                       ((t, s_, q) for s_, (ts, ql) in counters.queue_length_series(v).items()
                        for t, q in zip(ts.tolist(), ql.tolist())))
    membw = series_csv(("ts", "name", "memory_bw_gbps"),
                       ((t, kind, b) for kind, (ts, bw) in counters.memory_bw_series(v).items()
                        for t, b in zip(ts.tolist(), bw.tolist())))
    return {"series": [(f"queue_length_series_rank{v.rank}.csv", pack(queue)),
                       (f"memory_bw_series_rank{v.rank}.csv", pack(membw))],
            "pairs": [(f"cuda_kernel_launch_stats_rank{v.rank}.csv", pack(pairs_csv(pairs)))]}


def pack(text: str) -> bytes:
    return zlib.compress(text.encode("utf-8"), 1)


def unpack(packed: bytes) -> bytes:
    """The file's bytes (UTF-8 text)."""
    return zlib.decompress(packed)
