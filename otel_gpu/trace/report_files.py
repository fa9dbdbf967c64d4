"""The analysis' files: CSV tables (named as HTA names its outputs) and the JSON document, written
atomically by otel_gpu.output's rules."""
from __future__ import annotations

import json
import os

from .. import output
from . import rank_csv
from .analyze import jsonable
from .csv_text import csv_pieces as _csv_pieces, joined_pieces

# CSV file -> document key; file names follow HTA's outputs where there is one
CSV_TABLES = {
    "temporal_breakdown.csv": "temporal_breakdown",
    "gpu_kernel_breakdown_kernel_type.csv": "kernel_type_breakdown",
    "gpu_kernel_breakdown_kernels.csv": "kernel_breakdown",
    "idle_time_breakdown.csv": "idle_time_breakdown",
    "idle_time_interval_stats.csv": "idle_interval_stats",
    "comm_comp_overlap.csv": "comm_comp_overlap",
    "launch_summary.csv": "launch_stats",
    "queue_length_summary.csv": "queue_length_summary",
    "queue_full_blocked.csv": "queue_full_blocked",
    "memory_bw_summary.csv": "memory_bw_summary",
    "aten_op_kernels.csv": "aten_op_kernels",
    "gpu_user_annotation_breakdown.csv": "gpu_user_annotation_breakdown",
    "kernels_per_annotation.csv": "kernels_per_annotation",
    "kernel_sequences.csv": "kernel_sequences",  # only when asked for (--kernel-sequences)
    "critical_path.csv": "critical_path",
    "findings.csv": "findings",
    "checks.csv": "checks",
}


def _csv_text(rows: list[dict]) -> str:
    return "".join(_csv_pieces(rows))


def csv_files(doc: dict):
    """(file name, CSV) for each table of an analysis document, made as it is written: the CSV is
    its text in pieces (an iterator of str) or its UTF-8 bytes; join them for the whole text."""
    for name, key in CSV_TABLES.items():
        if key == "kernel_sequences" and key not in doc:
            continue
        made = None   # the ATen-op table's lines were made with each rank's analysis
        if key == "aten_op_kernels" and "_aten_csv" in doc:
            made = joined_pieces(doc["_aten_csv"], lambda packed: rank_csv.unpack(packed).decode("utf-8"))
        yield name, made if made is not None else _csv_pieces(doc.get(key) or [])
    yield "steps.csv", _csv_pieces(doc["cross_rank"]["steps"])
    ps = doc.get("potential_stragglers") or {}
    yield "potential_stragglers.csv", _csv_text([{"rank": int(r), "steps_flagged": n,
                                                  "potential_straggler": int(r) in ps.get("ranks", [])}
                                                 for r, n in (ps.get("counts") or {}).items()])
    per_rank = doc.get("_rank_csv", [])  # made with each rank's analysis (rank_csv): compressed, or staged
    for kind in ("series", "pairs"):
        for files in per_rank:
            for name, kept in files[kind]:
                yield name, rank_csv.unpack(kept) if isinstance(kept, bytes) else kept


class StageFailed(OSError):
    """A rank's CSV file could not be staged in the --csv folder (the OSError's errno, text and file)."""


class RankFileStage:
    """``analyze``'s ``keep_file`` for ``--csv DIR``: each rank's series and launch-pair files are
    staged where the rank is analysed (a worker process on large sets), as temporary files in DIR
    (``output.stage``), which ``write_outputs`` then syncs and renames with the other outputs: the
    main process neither compresses, holds nor writes them. A name in DIR that is a link to another
    folder, or not a regular file, is left to ``write_outputs`` (the text comes back compressed).
    ``close()`` removes what a failed run staged (a worker that died included) and DIR when this
    object made it and it stayed empty."""

    def __init__(self, csv_dir: str, inputs: list[str] = ()):
        self.dir = csv_dir
        self.made = not os.path.isdir(csv_dir)
        if self.made:
            try:
                os.makedirs(csv_dir)
            except OSError as exc:
                raise StageFailed(exc.errno, exc.strerror, exc.filename or csv_dir) from None
        self.real = os.path.realpath(csv_dir)
        self.inputs = output.input_ids(inputs)
        self.tag = f"otelgpu{os.getpid()}x{os.urandom(4).hex()}"   # (secrets would import OpenSSL: ~4 ms)

    def __call__(self, name: str, text: str):
        path = os.path.join(self.dir, name)
        label = f"--csv {self.dir}"
        try:
            t = output.plan(path, self.inputs, label)
            if t.kind != output.REPLACE or os.path.dirname(t.real) != self.real:
                return rank_csv.pack(text)
            return output.stage(t, text, tag=self.tag)
        except OSError as exc:
            raise StageFailed(exc.errno, exc.strerror, exc.filename or path) from None

    def close(self) -> None:
        output.discard_tagged(self.real, self.tag)
        if self.made and not os.listdir(self.dir):
            os.rmdir(self.dir)   # a failed run leaves no folder behind


def diff_csv(doc: dict) -> dict[str, str]:
    return {"trace_diff.csv": _csv_text(jsonable(doc)["rows"])}


def write_outputs(json_path: str | None, json_doc: dict | None, csv_dir: str | None, files,
                  inputs: list[str] = ()) -> int:
    """Write the JSON file and the CSV files (``files``: a dict or an iterable of (name, text)) by
    :mod:`otel_gpu.output`'s rules, as one: every path checked (none may be one of ``inputs``), every
    replaced file staged whole as its text is made (one text in memory at a time), then all put in
    place. Returns the number of CSV files written."""
    made = None
    if csv_dir and files and not os.path.isdir(csv_dir):
        os.makedirs(csv_dir)
        made = csv_dir
    n_csv = [0]

    def items():   # one table's text at a time: each is staged (written to its temporary file) in turn
        if json_path:
            yield json_path, json.dumps(jsonable(json_doc), indent=1, allow_nan=False)
        if csv_dir and files:
            for name, text in (files.items() if isinstance(files, dict) else files):
                n_csv[0] += 1
                yield os.path.join(csv_dir, name), text
    try:
        output.write_all(items(), inputs, labels=_labels(json_path, csv_dir))
    except BaseException:
        if made is not None and not os.listdir(made):
            os.rmdir(made)   # the folder this call made holds nothing: leave no trace of it
        raise
    return n_csv[0]


def _labels(json_path: str | None, csv_dir: str | None):
    """The label of each output in ``write_outputs``' order: the JSON file, then every CSV file."""
    if json_path:
        yield f"--json {json_path}"
    while True:
        yield f"--csv {csv_dir}"
