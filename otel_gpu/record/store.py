"""The recording's store: one SQLite file (`recording.sqlite`) per node and run.

SQLite (the standard library's, WAL journal) because it is embedded, crash-safe at every commit and
readable by any language; docs/record.md has the schema, the figures it was chosen by, and how to
read it with the `sqlite3` shell. Tables:

    meta(key, value)                              format, job, command, times, exit status
    resources(id, attrs)                          resource attributes, JSON object
    series(id, metric, kind, unit, temporality, resource, attrs, bounds)   one per metric and attribute set
    points(series, t, value, count, buckets)      t unix seconds; histograms: value = sum
    profiles(id, t0, t1, labels, sample_type, unit, period)               one per pushed pprof profile
    stacks(id, frames)                            JSON list of function names, root first
    samples(profile, stack, labels, value)        labels JSON object; value in the profile's unit
    stack_totals(profile_labels, sample_labels, stack, value)   samples summed over the run (what reports read)
    series_stats(series, n, first_t, first, last_t, last, last_count, mean, max)   per series over the whole
                                                  run, written when the recording is closed (absent after a crash)

`Writer` is used by one thread (the receiver's writer); each `add_*` call is one transaction, so a
crash loses at most the request being written. A full or failing disk (SQLite's SQLITE_FULL /
SQLITE_IOERR, the system's ENOSPC / EIO) is one `DiskError` naming the folder, whatever step hit it;
what was committed before stays readable.

What a run may make the store keep in memory or add is bounded (`RunLimits`): the series (their
count and the text of their names and attributes), the distinct stacks remembered by id (beyond,
looked up in the file), the text of the stacks stored. Past a bound, points of new series are
dropped and new stacks are stored as one placeholder stack (their samples' values still count);
`over` counts what each bound turned away.
"""
from __future__ import annotations

import errno
import json
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from ..errors import Failure
from .decode import Point, ProfileRows

FORMAT = "otel-gpu-recording"
VERSION = "1"
DB_NAME = "recording.sqlite"

SCHEMA = """
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS resources(id INTEGER PRIMARY KEY, attrs TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS series(
  id INTEGER PRIMARY KEY, metric TEXT NOT NULL, kind TEXT NOT NULL, unit TEXT NOT NULL,
  temporality TEXT NOT NULL, resource INTEGER NOT NULL REFERENCES resources(id), attrs TEXT NOT NULL,
  bounds TEXT, UNIQUE(metric, resource, attrs));
CREATE TABLE IF NOT EXISTS points(
  series INTEGER NOT NULL, t REAL NOT NULL, value REAL, count REAL, buckets TEXT,
  PRIMARY KEY(series, t)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS profiles(
  id INTEGER PRIMARY KEY, t0 REAL, t1 REAL, labels TEXT NOT NULL, sample_type TEXT, unit TEXT, period INTEGER);
CREATE TABLE IF NOT EXISTS stacks(id INTEGER PRIMARY KEY, frames TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS samples(profile INTEGER NOT NULL, stack INTEGER NOT NULL, labels TEXT NOT NULL, value INTEGER);
CREATE TABLE IF NOT EXISTS series_stats(
  series INTEGER PRIMARY KEY, n INTEGER, first_t REAL, first REAL, last_t REAL, last REAL, last_count REAL,
  mean REAL, max REAL);
CREATE TABLE IF NOT EXISTS stack_totals(
  profile_labels TEXT NOT NULL, sample_labels TEXT NOT NULL, stack INTEGER NOT NULL, unit TEXT NOT NULL, value INTEGER,
  PRIMARY KEY(profile_labels, sample_labels, stack, unit)) WITHOUT ROWID;
"""


DISK_FULL, DISK_IO = "the disk is full", "the disk fails (I/O error)"


def disk_problem(exc: BaseException) -> str | None:
    """What is wrong with the disk under the store, from SQLite's error (SQLITE_FULL, SQLITE_IOERR_*)
    or the system's (ENOSPC, EDQUOT, EIO); None for any other error."""
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        text = str(exc)
        if name == "SQLITE_FULL" or "database or disk is full" in text:
            return DISK_FULL
        if name.startswith("SQLITE_IOERR") or "disk I/O error" in text:
            return DISK_IO
    elif isinstance(exc, OSError):
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return DISK_FULL
        if exc.errno == errno.EIO:
            return DISK_IO
    return None


class DiskError(Failure):
    """The store could not write because its disk is full or failing; `problem` says which."""

    def __init__(self, directory: Path, problem: str):
        super().__init__(f"{directory}: {problem}")
        self.directory, self.problem = directory, problem


@dataclass(frozen=True)
class RunLimits:
    """What one recording may hold in memory or grow by (text in characters)."""
    series: int = 50_000               # distinct series
    series_text: int = 16 << 20        # their metric names and attribute JSON, in all
    stack_cache_text: int = 16 << 20   # stack JSON remembered in memory (beyond: looked up in the file)
    stack_text: int = 512 << 20        # stack JSON stored in all


RUN_LIMITS = RunLimits()
SERIES_BOUND = "series"
STACK_BOUND = "stacks"
STACK_PLACEHOLDER = ("[stack not recorded: the recording's bound on stack text was reached]",)


def _json(pairs) -> str:
    return json.dumps(dict(pairs), sort_keys=True, separators=(",", ":"))


class Writer:
    """Appends points and profiles to `<dir>/recording.sqlite` (created with its schema)."""

    def __init__(self, directory: Path, meta: Mapping[str, str] = (), limits: RunLimits = RUN_LIMITS):
        self.directory = directory
        self.limits = limits
        self.over: dict[str, int] = {}   # SERIES_BOUND: points dropped; STACK_BOUND: samples given the placeholder
        self._series_text = 0
        self._stack_text = 0
        self._stack_cache_text = 0
        with self._disk():
            directory.mkdir(parents=True, exist_ok=True)
            self.path = directory / DB_NAME
            self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            try:
                self.db.executescript(SCHEMA)
                self.db.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                self.db.close()
                raise
        self._resources: dict[str, int] = {}
        self._series: dict[tuple, int] = {}
        self._stacks: dict[str, int] = {}   # stack JSON -> id, while within limits.stack_cache_text
        self._stats: dict[int, list] = {}   # series -> [n, first_t, first, last_t, last, last_count, sum, max]
        self.set_meta({"format": FORMAT, "version": VERSION, **dict(meta)})

    @contextmanager
    def _disk(self):
        """SQLite's and the system's disk-full and I/O errors as one DiskError naming the folder."""
        try:
            yield
        except (sqlite3.Error, OSError) as exc:
            problem = disk_problem(exc)
            if problem is None:
                raise
            raise DiskError(self.directory, problem) from exc

    def _rollback(self) -> None:
        if self.db.in_transaction:   # SQLite may have rolled back already (a full disk does that)
            self.db.execute("ROLLBACK")

    def set_meta(self, meta: Mapping[str, str]) -> None:
        with self._disk(), self.db:
            self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, str(v)) for k, v in meta.items()])

    def _id(self, cache: dict, key, insert: str, args: tuple, select: str, sargs: tuple) -> int:
        got = cache.get(key)
        if got is None:
            cur = self.db.execute(insert, args)
            got = cur.lastrowid if cur.rowcount else self.db.execute(select, sargs).fetchone()[0]
            cache[key] = got
        return got

    def add_points(self, points: Iterable[Point]) -> int:
        """Store points in one transaction; returns how many. DiskError when the disk is full."""
        with self._disk():
            return self._add_points(points)

    def _add_points(self, points: Iterable[Point]) -> int:
        rows = []
        self.db.execute("BEGIN")
        try:
            for p in points:
                sid = self._series.get((p.metric, p.resource, p.attrs))
                if sid is None:
                    sid = self._series_id(p)
                    if sid is None:
                        continue
                rows.append((sid, p.t, p.value, p.count, json.dumps(p.buckets) if p.buckets is not None else None))
                st = self._stats.get(sid)
                if st is None:
                    self._stats[sid] = [1, p.t, p.value, p.t, p.value, p.count, p.value, p.value]
                else:
                    st[0] += 1
                    st[6] += p.value
                    st[7] = max(st[7], p.value)
                    if p.t < st[1]:
                        st[1], st[2] = p.t, p.value
                    if p.t >= st[3]:
                        st[3], st[4], st[5] = p.t, p.value, p.count
            self.db.executemany("INSERT OR REPLACE INTO points VALUES (?,?,?,?,?)", rows)
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return len(rows)

    def _series_id(self, p: Point) -> int | None:
        """The series' id (new: stored); None, counted in `over`, past the run's series bounds."""
        res = _json(p.resource)
        attrs = _json(p.attrs)
        text = len(p.metric) + len(res) + len(attrs)
        if len(self._series) >= self.limits.series or self._series_text + text > self.limits.series_text:
            self.over[SERIES_BOUND] = self.over.get(SERIES_BOUND, 0) + 1
            return None
        self._series_text += text
        rid = self._id(self._resources, res, "INSERT OR IGNORE INTO resources(attrs) VALUES (?)", (res,),
                       "SELECT id FROM resources WHERE attrs=?", (res,))
        sid = self._id({}, None, "INSERT OR IGNORE INTO series(metric, kind, unit, temporality, resource, attrs, bounds) "
                       "VALUES (?,?,?,?,?,?,?)",
                       (p.metric, p.kind, p.unit, p.temporality, rid, attrs,
                        json.dumps(p.bounds) if p.bounds is not None else None),
                       "SELECT id FROM series WHERE metric=? AND resource=? AND attrs=?", (p.metric, rid, attrs))
        self._series[(p.metric, p.resource, p.attrs)] = sid
        return sid

    def add_profiles(self, profiles: Iterable[ProfileRows]) -> int:
        """Store profiles and their samples in one transaction; returns the number of samples.
        DiskError when the disk is full."""
        with self._disk():
            return self._add_profiles(profiles)

    def _add_profiles(self, profiles: Iterable[ProfileRows]) -> int:
        n = 0
        self.db.execute("BEGIN")
        try:
            for p in profiles:
                plabels = _json(sorted(p.labels.items()))
                pid = self.db.execute("INSERT INTO profiles(t0, t1, labels, sample_type, unit, period) VALUES (?,?,?,?,?,?)",
                                      (p.t0, p.t1, plabels, p.sample_type, p.unit, p.period)).lastrowid
                rows = []
                for stack, labels, value in p.samples:
                    rows.append((pid, self._stack_id(stack), _json(labels), value))
                self.db.executemany("INSERT INTO samples VALUES (?,?,?,?)", rows)
                self.db.executemany("INSERT INTO stack_totals VALUES (?,?,?,?,?) ON CONFLICT DO UPDATE "
                                    "SET value = value + excluded.value",
                                    [(plabels, labels, sid, p.unit or "", value) for _, sid, labels, value in rows])
                n += len(rows)
            self.db.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise
        return n

    def _stack_id(self, stack: tuple) -> int:
        """The stack's id (new: stored); remembered while the cache is within its bound; past the
        run's bound on stored stack text, a new stack is the placeholder stack."""
        frames = json.dumps(list(stack), separators=(",", ":"))
        sid = self._stacks.get(frames)
        if sid is not None:
            return sid
        row = self.db.execute("SELECT id FROM stacks WHERE frames=?", (frames,)).fetchone()
        if row is None:
            if self._stack_text + len(frames) > self.limits.stack_text:
                self.over[STACK_BOUND] = self.over.get(STACK_BOUND, 0) + 1
                return self._stack_id(STACK_PLACEHOLDER) if stack != STACK_PLACEHOLDER else self._insert_stack(frames)
            self._stack_text += len(frames)
            sid = self._insert_stack(frames)
        else:
            sid = row[0]
        if self._stack_cache_text + len(frames) <= self.limits.stack_cache_text:
            self._stack_cache_text += len(frames)
            self._stacks[frames] = sid
        return sid

    def _insert_stack(self, frames: str) -> int:
        cur = self.db.execute("INSERT OR IGNORE INTO stacks(frames) VALUES (?)", (frames,))
        return cur.lastrowid if cur.rowcount else self.db.execute("SELECT id FROM stacks WHERE frames=?", (frames,)).fetchone()[0]

    def close(self) -> None:
        """Write the per-series statistics of the whole run, fold the journal into the file, close.

        The connection is closed whatever happens; on a full disk (DiskError) what was committed
        stays readable (in the file and its -wal journal), only the statistics may be missing."""
        try:
            with self._disk():
                with self.db:
                    self.db.executemany("INSERT OR REPLACE INTO series_stats VALUES (?,?,?,?,?,?,?,?,?)",
                                        [(sid, n, ft, f, lt, last, lc, total / n, mx)
                                         for sid, (n, ft, f, lt, last, lc, total, mx) in self._stats.items()])
                self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                self.db.execute("PRAGMA journal_mode=DELETE")   # finished: one plain file, no -wal/-shm beside it
        finally:
            self.db.close()
