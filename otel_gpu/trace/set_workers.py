"""Read and analyse a folder of per-rank traces in worker processes that each keep the ranks they
read: a rank's events never leave the process that read them, and no process holds every rank's
events (this one holds the per-rank results only).

Two rounds over a pipe per worker. First each worker reads its share of the files (balanced by
size, in file order) and reports what the set needs before any rank can be analysed: each file's
rank, earliest start and ``ProfilerStep`` names, and what reading noticed. This process then decides
as :func:`.model.load_set` does (the set's start, whether HTA's rule drops the last step, which file
is each rank's, which ranks were asked for) and tells every worker; each worker analyses its ranks
and sends each rank's results (:func:`.analyze.one_rank`). The document is the one
:func:`.analyze.analyze` makes from :func:`.model.load_set`'s set, byte for byte.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import numpy as np

from ..errors import UsageError
from . import analyze as A
from . import model
from .parse import TraceFormatError
from .rank_pool import default_jobs, frozen_heap


class WorkerFailed(RuntimeError):
    """A worker process ended without its results, or an analysis raised in it (the message says which)."""


@dataclass
class FileHead:
    """What the set needs of one read file before its rank is analysed."""

    order: int          # position in the folder's sorted file list
    path: str
    rank: int
    first_ts: int | None
    step_names: set[str]
    notes: list[str] = field(default_factory=list)


def shares(sizes: list[int], jobs: int) -> list[list[int]]:
    """File indices per worker: largest first to the least loaded, each share in file order."""
    loads = [0] * jobs
    out: list[list[int]] = [[] for _ in range(jobs)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        w = loads.index(min(loads))
        out[w].append(i)
        loads[w] += max(sizes[i], 1)
    return [sorted(s) for s in out if s]


def analyze_folder(directory: str, opts: A.Options | None = None, ranks: list[int] | None = None,
                   include_last_step: bool = False, jobs: int | None = None, keep_file=A.rank_csv.packed,
                   gpu_time: bool = False, meanwhile=None) -> dict:
    """``analyze(load_set(directory, ranks, include_last_step), opts, keep_file=keep_file)``, with
    each rank read and analysed in one of ``jobs`` forked workers (default one per core) when the
    files are large enough to pay for them. ``gpu_time``: each rank's GPU time by launching stack
    under ``_gpu_time`` (rank -> stacks); ``meanwhile()`` (optional) runs here while the workers read.
    Raises :class:`TraceFormatError` as ``load_set`` does, :class:`WorkerFailed` when a worker dies."""
    opts = opts or A.Options()
    files, skipped = model.find_trace_files(directory)
    workers = jobs
    if workers is None:
        workers = default_jobs() if sum(map(os.path.getsize, files)) > model.PARALLEL_MIN_BYTES else 1
    workers = min(workers, len(files))
    if workers <= 1 or "fork" not in mp.get_all_start_methods():   # read here; analyses as `analyze` decides
        ts = model.load_set(directory, ranks, include_last_step, jobs=1, meanwhile=meanwhile)
        doc = A.analyze(ts, opts, jobs=jobs, keep_file=keep_file)
        if gpu_time:
            from .gpu_flame import set_stacks
            doc["_gpu_time"] = set_stacks(ts)
        return doc
    with _Workers(files, shares(list(map(os.path.getsize, files)), workers), opts, keep_file, gpu_time) as pool:
        if meanwhile is not None:
            meanwhile()
        heads = pool.heads()
        kept, notes = _choose(directory, files, heads, ranks)
        step_names = set().union(*(heads[i].step_names for i in kept.values()))
        filtered, note = model.step_rule(step_names, include_last_step)
        starts = [heads[i].first_ts for i in kept.values() if heads[i].first_ts is not None]
        order = sorted(kept)
        per = pool.analyse([kept[r] for r in order], min(starts) if starts else 0, filtered, many=len(order) > 1)
    cpu_only = [p.pop("cpu_only") for p in per]
    notes = skipped + notes + [note] + [n for n in cpu_only if n]
    return A.combine(directory, order, per, notes, filtered, opts)


def _choose(directory: str, files: list[str], heads: dict[int, FileHead],
            ranks: list[int] | None) -> tuple[dict[int, int], list[str]]:
    """(rank -> file index, notes): a later file wins on a duplicate rank (``model.load_events``),
    then only the ``ranks`` asked for (``model.load_set``)."""
    kept: dict[int, int] = {}
    notes: list[str] = []
    for i in range(len(files)):
        h = heads[i]
        notes += h.notes
        if h.rank in kept:
            notes.append(model.duplicate_note(h.rank, files[kept[h.rank]], h.path))
        kept[h.rank] = i
    return model.asked_ranks(directory, kept, ranks), notes


def _held(ev: model.RankEvents) -> tuple[model.RankEvents, int | None]:
    """(the rank as it waits for the set's start, what its start times are offsets from or None):
    every file must be read first, so meanwhile its start times are held as int32 offsets from its
    earliest and its durations as float32, where each is exact (8 of the 34 bytes an event);
    ``_restored`` gives the arrays back as they were read."""
    ts, dur, base = ev.ts, ev.dur, None
    if len(ts) and ts.dtype == np.int64 and int(ts.max()) - int(ts.min()) < 1 << 31:
        base = int(ts.min())
        ev.ts = (ts - base).astype(np.int32)
    if dur.dtype == np.float64:
        narrow = dur.astype(np.float32)
        if np.array_equal(narrow, dur):
            ev.dur = narrow
    return ev, base


def _restored(ev: model.RankEvents, base: int | None) -> model.RankEvents:
    """The held rank's arrays as they were read (int64 start times, float64 durations)."""
    if base is not None:
        ev.ts = ev.ts.astype(np.int64) + base
    if ev.dur.dtype == np.float32:
        ev.dur = ev.dur.astype(np.float64)
    return ev


def _ended(p) -> str:
    p.join(timeout=1)
    code = p.exitcode
    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
    return f"a worker process ended without its results ({how})"


class _Workers:
    """Forked workers, each with its share of the files, spoken to over one pipe each."""

    def __init__(self, files: list[str], parts: list[list[int]], opts: A.Options, keep_file, gpu_time: bool):
        self.files, self.parts = files, parts
        self.opts, self.keep_file, self.gpu_time = opts, keep_file, gpu_time
        self.conns: list = []
        self.procs: list = []

    def __enter__(self) -> "_Workers":
        ctx = mp.get_context("fork")
        with frozen_heap():   # the workers' collections do not walk (and copy) this process's heap
            for part in self.parts:
                here, there = ctx.Pipe()
                p = ctx.Process(target=self._work, args=(there, here, part), daemon=True)
                p.start()
                there.close()
                self.conns.append(here)
                self.procs.append(p)
        return self

    def __exit__(self, exc_type, *exc) -> None:
        """When this process fails, every worker is killed (what they staged is the caller's to
        discard); otherwise each ends on its own once it has sent everything."""
        for c in self.conns:
            c.close()
        for p in self.procs:
            if exc_type is not None:
                p.kill()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()

    # -- this process's side --------------------------------------------------------------------
    def _receive(self, owed: dict) -> list:
        """The messages each worker owes (pipe -> how many), in any order; a worker's error or death
        raises. A worker that reports an unreadable file owes nothing more."""
        got: list = []
        live = {c: n for c, n in owed.items() if n}
        proc_of = dict(zip(self.conns, self.procs))
        while live:
            sentinels = {proc_of[c].sentinel: c for c in live}
            for r in wait(list(live) + list(sentinels)):
                c = sentinels.get(r, r)
                if c not in live:
                    continue
                if c.poll():
                    try:
                        msg = c.recv()
                    except EOFError:
                        msg = ("error", None)
                elif r is c:
                    continue
                else:
                    msg = ("error", None)
                if msg[0] == "raise":
                    raise msg[1]
                if msg[0] == "error":
                    raise WorkerFailed(msg[1] or _ended(proc_of[c]))
                if msg[0] == "rank":   # kept with the other ranks' strings shared (the copy it came as goes)
                    msg = (msg[0], msg[1], A.share_strings(msg[2]))
                got.append(msg)
                live[c] = 0 if msg[0] == "format" else live[c] - 1
                if not live[c]:
                    del live[c]
        return got

    def heads(self) -> dict[int, FileHead]:
        """Every file's head; the first unreadable file in folder order raises its error."""
        got = self._receive({c: len(part) for c, part in zip(self.conns, self.parts)})
        errors = sorted((m[1], m[2]) for m in got if m[0] == "format")
        if errors:
            raise TraceFormatError(errors[0][1])
        return {m[1].order: m[1] for m in got}

    def analyse(self, chosen: list[int], ts0: int, filtered: bool, many: bool) -> list[dict]:
        """Each chosen file's rank results, in ``chosen``'s order."""
        mine = {c: [i for i in chosen if i in set(part)] for c, part in zip(self.conns, self.parts)}
        for c, files in mine.items():
            c.send((ts0, filtered, many, files))
        by_file = {m[1]: m[2] for m in self._receive({c: len(files) for c, files in mine.items()})}
        return [by_file[i] for i in chosen]

    # -- a worker's side ------------------------------------------------------------------------
    def _work(self, conn, parents_end, part: list[int]) -> None:
        for c in self.conns + [parents_end]:   # this process's copies of the other ends: closed, so
            c.close()                           # that a recv here ends when this process's end closes
        try:
            A.prepare_workers()   # here, not before the fork: this process's peak is the set's bound
            read: dict[int, tuple[model.RankEvents, int | None]] = {}
            for i in part:
                try:
                    ev = model.read_trace(self.files[i])   # (derived when analysed: not held meanwhile)
                except TraceFormatError as exc:
                    conn.send(("format", i, str(exc)))
                    return
                conn.send(("head", FileHead(i, ev.path, ev.rank, model.first_ts(ev), model.step_names(ev),
                                            model.read_notes(ev))))
                read[i] = _held(ev)   # (after its head: the times read as they were)
            try:
                ts0, filtered, many, chosen = conn.recv()
            except EOFError:   # this process gave up (another file was unreadable)
                return
            for i in list(read):
                if i not in chosen:
                    del read[i]
            for i in chosen:
                v = model.rank_view(_restored(*read.pop(i)), filtered, ts0)
                out = A.one_rank(v, self.opts, many, self.keep_file, self.gpu_time)
                out["cpu_only"] = model.cpu_only_note(v)
                del v
                conn.send(("rank", i, out))
        except (UsageError, OSError) as exc:   # an output that cannot be written: raised here as there
            conn.send(("raise", exc))
        except BaseException as exc:   # said to this process, which fails with it: never a silent exit
            where = traceback.extract_tb(exc.__traceback__)[-1]
            conn.send(("error", f"the analysis failed in a worker process: {type(exc).__name__}: {exc} "
                                f"({os.path.basename(where.filename)}:{where.lineno})"))
        finally:
            conn.close()
