"""The per-rank CSV files (queue-length and memory-bandwidth time series, launch pairs), made where
the rank is analysed (a worker process on large sets) and either staged there as files (the CLI with
--csv) or kept zlib-compressed until written: the main process neither recomputes the series nor
holds every rank's text at once."""
from __future__ import annotations

import zlib
from itertools import chain
from typing import Callable

import numpy as np

from . import counters
from .csv_text import field_writer

PAIR_COLUMNS = ("correlation", "cpu_duration", "gpu_duration", "launch_delay")


def series_csv(columns: tuple[str, str, str], series: dict) -> str:
    """A time series file: for each key (a stream or a name) of ``series`` (key -> (ts us, values)),
    one line per point "ts,key,value", as ``csv.writer`` writes them (``str`` of numbers; the key
    quoted where the csv module would quote it), in C-level loops."""
    quote = field_writer()
    parts = [",".join(columns) + "\n"]
    for key, (ts, values) in series.items():
        if len(ts):
            key_text = quote(key) if type(key) is str else str(key)
            line = "%s," + key_text.replace("%", "%%") + ",%s\n"   # one format over all points: a C loop
            parts.append((line * len(ts)) % _interleaved(ts, values))
    return "".join(parts)


def _interleaved(a: np.ndarray, b: np.ndarray) -> tuple:
    """(a[0], b[0], a[1], b[1], ...) as the Python numbers ``tolist`` gives."""
    if a.dtype == b.dtype:   # one array: its tolist gives each the same number
        return tuple(np.column_stack((a, b)).ravel().tolist())
    return tuple(chain.from_iterable(zip(a.tolist(), b.tolist())))


def pairs_csv(pairs: dict) -> str:
    """Every launch paired with its GPU event: correlation, cpu/gpu duration, launch delay (us), each
    number as its ``repr``; one format over all rows (a C loop)."""
    n = len(pairs[PAIR_COLUMNS[0]])
    fields, values = zip(*(_repr_field(pairs[c]) for c in PAIR_COLUMNS))
    if "%r" in fields:
        flat = tuple(chain.from_iterable(zip(*(v.tolist() for v in values))))
    else:   # integers only: one array's tolist
        flat = tuple(np.column_stack(values).ravel().tolist())
    return ",".join(PAIR_COLUMNS) + "\n" + ((",".join(fields) + "\n") * n) % flat


def _repr_field(a: np.ndarray) -> tuple[str, np.ndarray]:
    """(the format field, the values) writing each number of ``a`` as its ``repr``: whole floats
    (traces rounded to the microsecond have nothing else) as integers with ".0", which is their
    ``repr`` below 1e16, -0.0 excepted; integers as integers; anything else by ``repr``."""
    if a.dtype.kind in "iu":
        return "%d", a.astype(np.int64)
    if a.dtype.kind == "f" and len(a) and (np.abs(a) < 1e15).all() and (a == np.floor(a)).all() \
            and not (np.signbit(a) & (a == 0)).any():
        return "%d.0", a.astype(np.int64)
    return "%r", a


def rank_files(v, pairs: dict, keep: Callable[[str, str], object] | None) -> dict[str, list[tuple[str, object]]]:
    """The rank's series and launch-pair files: {"series": [(name, kept)], "pairs": [(name, kept)]}
    where ``kept`` is what ``keep(name, text)`` makes of each file (``packed``: its compressed text;
    the CLI stages the file itself, see report_files.RankFileStage); ``keep`` None: no file is made."""
    if keep is None:
        return {"series": [], "pairs": []}

    def kept(name: str, text: str) -> tuple[str, object]:
        return name, keep(name, text)
    r = v.rank
    queue = series_csv(("ts", "stream", "queue_length"), counters.queue_length_series(v))
    membw = series_csv(("ts", "name", "memory_bw_gbps"), counters.memory_bw_series(v))
    return {"series": [kept(f"queue_length_series_rank{r}.csv", queue), kept(f"memory_bw_series_rank{r}.csv", membw)],
            "pairs": [kept(f"cuda_kernel_launch_stats_rank{r}.csv", pairs_csv(pairs))]}


def pack(text: str) -> bytes:
    return zlib.compress(text.encode("utf-8"), 1)


def packed(name: str, text: str) -> bytes:
    """A file kept in memory until written: its text compressed (``unpack`` gives its bytes)."""
    return pack(text)


def unpack(packed: bytes) -> bytes:
    """The file's bytes (UTF-8 text)."""
    return zlib.decompress(packed)
