"""Reading recordings: one or more run directories (one per node) seen as one job.

    rec = Recording.open([Path("otel-gpu-runs/train-20250101T000000Z")])
    for s in rec.series("otelgpu.train.steps"): print(s.attrs["otelgpu.rank"], s.points[-1])

A recording is a file anyone could have edited: content that is not what the store writes (a meta
time that is no number, attributes that are no JSON object, a point value that is text, a damaged
database) is a `RecordingError` saying "unreadable", never another exception. Points that are NaN or
infinite (SQLite keeps NaN as NULL) are left out of every read; `nonfinite_points` says how many.
"""
from __future__ import annotations

import functools
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from .content import FINITE, ContentError, frames as _frames, json_object as _object, meta_problem
from .content import number as _number, numbers as _numbers
from .store import DB_NAME, FORMAT, VERSION


class RecordingError(RuntimeError):
    """A directory that holds no readable recording: one line for the user."""


class RecordingVersionError(RecordingError):
    """A recording written in a format version this otel-gpu does not read: bad input (exit 2)."""


@dataclass
class Series:
    """One metric and attribute set: `attrs` is the resource's attributes with the point's on top;
    `points` are (t unix s, value) in time order; `counts` histogram counts (else empty)."""
    metric: str
    kind: str
    unit: str
    attrs: dict[str, str]
    points: list[tuple[float, float]] = field(default_factory=list)
    counts: list[float] = field(default_factory=list)

    def get(self, key: str, default: str = "") -> str:
        return self.attrs.get(key, default)


@dataclass(frozen=True)
class Summary:
    """One series over a window: points, first/last time (unix s) and value, mean, peak, last count."""
    n: int
    first_t: float
    last_t: float
    first: float
    last: float
    mean: float
    max: float
    last_count: float | None = None

    @property
    def rate(self) -> float | None:
        """(last - first) / (last_t - first_t): a counter's mean rate, None under two points."""
        return (self.last - self.first) / (self.last_t - self.first_t) if self.n >= 2 and self.last_t > self.first_t else None


def _connect(d: Path) -> sqlite3.Connection:
    path = d / DB_NAME
    if not path.is_file():
        raise RecordingError(f"{d}: not a recording (no {DB_NAME})")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        meta = dict(db.execute("SELECT key, value FROM meta"))
    except sqlite3.DatabaseError as exc:
        raise RecordingError(f"{path}: unreadable ({exc})") from None
    if meta.get("format") != FORMAT:
        db.close()
        raise RecordingError(f"{path}: not an otel-gpu recording")
    version = meta.get("version")
    if version != VERSION:
        db.close()
        shown = "none" if version is None else repr(" ".join(str(version).split())[:40])
        raise RecordingVersionError(f"{path}: recording format version {shown}; this otel-gpu reads version "
                                    f"{VERSION} only")
    problem = meta_problem(meta)
    if problem:
        db.close()
        raise RecordingError(f"{path}: unreadable ({problem})")
    return db


def _reads(fn):
    """A read of the recording: a database error (damaged pages, a missing table) or content that is not
    what the store writes is one RecordingError naming the recording."""
    @functools.wraps(fn)
    def read(self, *args, **kw):
        try:
            return fn(self, *args, **kw)
        except sqlite3.DatabaseError as exc:
            raise RecordingError(f"{', '.join(map(str, self.dirs))}: unreadable ({exc})") from None
        except ContentError as exc:
            raise RecordingError(f"{', '.join(map(str, self.dirs))}: unreadable ({exc})") from None
    return read


class Recording:
    def __init__(self, dirs: Sequence[Path], dbs: Sequence[sqlite3.Connection]):
        self.dirs = list(dirs)
        self.dbs = list(dbs)
        self.metas = [dict(db.execute("SELECT key, value FROM meta")) for db in self.dbs]
        self._stacks: list | None = None
        self._nonfinite: int | None = None

    @classmethod
    def open(cls, dirs: Sequence[Path | str]) -> "Recording":
        """The recordings in `dirs` as one job: a directory named twice counts once; two copies of one
        recording (same host and start) are a RecordingError, as their steps would count twice."""
        paths: list[Path] = []
        for d in map(Path, dirs):
            if not any(d.resolve() == p.resolve() for p in paths):
                paths.append(d)
        dbs: list[sqlite3.Connection] = []
        try:
            seen: dict[tuple[str, str], Path] = {}
            for p in paths:
                dbs.append(_connect(p))
                meta = dict(dbs[-1].execute("SELECT key, value FROM meta WHERE key IN ('host', 'started')"))
                key = (meta.get("host", ""), meta.get("started", ""))
                if key[1] and key in seen:
                    raise RecordingError(f"{seen[key]} and {p} are copies of one recording (host {key[0]}, same "
                                         "start): give it once")
                seen[key] = p
        except BaseException:
            for db in dbs:
                db.close()
            raise
        return cls(paths, dbs)

    def close(self) -> None:
        for db in self.dbs:
            db.close()

    def __enter__(self) -> "Recording":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def job(self) -> str | None:
        return next((m["job"] for m in self.metas if m.get("job")), None)

    @_reads
    def metrics(self) -> list[str]:
        return sorted({m for db in self.dbs for (m,) in db.execute("SELECT DISTINCT metric FROM series")})

    @_reads
    def span(self) -> tuple[float, float] | None:
        """(first, last) time of the recording (unix s): the run's start and end when known, else its points."""
        lo, hi = [], []
        for db, meta in zip(self.dbs, self.metas):
            if meta.get("started") and meta.get("ended"):
                lo.append(float(meta["started"]))
                hi.append(float(meta["ended"]))
                continue
            t0, t1 = (_number(x, "a point's time") for x in db.execute("SELECT min(t), max(t) FROM points").fetchone())
            p0, p1 = (_number(x, "a profile's time") for x in db.execute("SELECT min(t0), max(t1) FROM profiles").fetchone())
            starts = [float(meta["started"])] if meta.get("started") else [x for x in (t0, p0) if x is not None]
            ends = [x for x in (t1, p1) if x is not None]
            lo += starts
            hi += ends
        return (min(lo), max(hi)) if lo and hi else None

    def _series_of(self, db: sqlite3.Connection, metric: str) -> dict[int, Series]:
        return {sid: Series(metric, kind, unit, {**_object(res, "resource attributes"), **_object(attrs, "attributes")})
                for sid, kind, unit, res, attrs in
                db.execute("SELECT s.id, s.kind, s.unit, r.attrs, s.attrs FROM series s JOIN resources r "
                           "ON r.id = s.resource WHERE s.metric = ? ORDER BY s.id", (metric,))}

    @_reads
    def nonfinite_points(self) -> int:
        """How many points are NaN or infinite (left out of every read), counted once: none where a
        cleanly closed recording's statistics are all finite (they sum every point), else by a scan."""
        if self._nonfinite is None:
            self._nonfinite = sum(0 if self._finite_stats(db, every=True) else
                                  db.execute(f"SELECT count(*) FROM points p WHERE NOT ({FINITE})").fetchone()[0]
                                  for db in self.dbs)
        return self._nonfinite

    @_reads
    def series(self, metric: str, t0: float | None = None, t1: float | None = None,
               step: float | None = None) -> list[Series]:
        """Every series of `metric` with its points in [t0, t1]. With `step` (s), one point per series
        and step-long bucket (from t0): its last point for counters and histograms (cumulative
        values), the bucket's mean value at its last time for gauges."""
        out: list[Series] = []
        lo, hi = (t0 if t0 is not None else -1e18), (t1 if t1 is not None else 1e18)
        for db in self.dbs:
            by_id = self._series_of(db, metric)
            if not by_id:
                continue
            if step:
                q = ("SELECT p.series, MAX(p.t), CASE WHEN s.kind IN ('gauge', 'updowncounter') THEN AVG(p.value) "
                     "ELSE p.value END, p.count FROM points p JOIN series s ON s.id = p.series "
                     f"WHERE s.metric = ? AND p.t BETWEEN ? AND ? AND {FINITE} "
                     "GROUP BY p.series, CAST((p.t - ?) / ? AS INTEGER) ORDER BY p.series, 2")
                rows = db.execute(q, (metric, lo, hi, lo if t0 is not None else 0.0, step)).fetchall()
            else:
                rows = db.execute("SELECT p.series, p.t, p.value, p.count FROM points p JOIN series s ON s.id = p.series "
                                  f"WHERE s.metric = ? AND p.t BETWEEN ? AND ? AND {FINITE} ORDER BY p.series, p.t",
                                  (metric, lo, hi)).fetchall()
            for sid, t, value, count in rows:
                s = by_id[sid]
                if value.__class__ is not float and value.__class__ is not int or count.__class__ is str:
                    _number(value, f"a point of {metric}"), _number(count, f"a count of {metric}")
                s.points.append((t, value))
                if count is not None:
                    s.counts.append(count)
            out += [s for s in by_id.values() if s.points]
        return out

    @_reads
    def histograms(self, metric: str, t0: float | None = None,
                   t1: float | None = None) -> list[tuple[Series, tuple[float, ...], list[float]]]:
        """Every histogram series of `metric` with its bucket bounds and the bucket counts of what was
        observed in (t0, t1]: a cumulative series' counts at its last point in the window less those at
        its last point before t0; a delta series' counts summed over the window."""
        out = []
        lo, hi = (t0 if t0 is not None else -1e18), (t1 if t1 is not None else 1e18)
        for db in self.dbs:
            q = ("SELECT s.id, s.temporality, s.bounds, p.t, p.buckets FROM points p JOIN series s ON s.id = p.series "
                 "WHERE s.metric = ? AND s.kind = 'histogram' AND p.t <= ? AND p.buckets IS NOT NULL ORDER BY s.id, p.t")
            rows: dict[int, list] = {}
            for sid, temporality, bounds, t, buckets in db.execute(q, (metric, hi)):
                try:
                    counts, bounds = _numbers(json.loads(buckets)), _numbers(json.loads(bounds or "[]"))
                except (TypeError, ValueError):
                    counts = None
                if counts is None or bounds is None:   # a damaged row: left out (the median then says "-")
                    continue
                got = rows.setdefault(sid, [temporality, bounds, None, None])
                if t <= lo:
                    got[2] = counts if temporality != "delta" else None      # the baseline before the window
                elif temporality == "delta":
                    got[3] = counts if got[3] is None else [a + b for a, b in zip(got[3], counts)]
                else:
                    got[3] = counts
            by_id = self._series_of(db, metric)
            for sid, (temporality, bounds, before, counts) in rows.items():
                if counts is None:
                    continue
                if before is not None and len(before) == len(counts):
                    counts = [max(0.0, a - b) for a, b in zip(counts, before)]
                out.append((by_id[sid], tuple(bounds), counts))
        return out

    @_reads
    def summaries(self, metric: str, t0: float | None = None, t1: float | None = None, *,
                  rebase: bool = False) -> list[tuple[Series, Summary]]:
        """Every series of `metric` with its statistics over [t0, t1], no points: from `series_stats`
        when the window spans a cleanly closed recording, else computed by SQLite from the points.
        `rebase`: cumulative counters and histograms count from their last point before t0 (what
        they counted inside the window, as a PromQL `x - x offset W`), not from the run's start."""
        out = []
        lo, hi = (t0 if t0 is not None else -1e18), (t1 if t1 is not None else 1e18)
        for db, meta in zip(self.dbs, self.metas):
            by_id = self._series_of(db, metric)
            if not by_id:
                continue
            if rebase and t0 is not None:
                out += [(by_id[sid], st) for sid, st in self._rebased(db, metric, lo, hi)]
                continue
            if self._whole_run(db, meta, lo, hi):
                q = ("SELECT st.series, st.n, st.first_t, st.last_t, st.first, st.last, st.mean, st.max, st.last_count "
                     "FROM series_stats st JOIN series s ON s.id = st.series WHERE s.metric = ?")
                for sid, *stats in db.execute(q, (metric,)):
                    out.append((by_id[sid], Summary(*(_number(x, f"a statistic of {metric}") for x in stats))))
                continue
            q = ("WITH agg AS (SELECT p.series AS sid, COUNT(*) AS n, MIN(p.t) AS ft, MAX(p.t) AS lt, "
                 "AVG(p.value) AS av, MAX(p.value) AS mx FROM points p JOIN series s ON s.id = p.series "
                 f"WHERE s.metric = ? AND p.t BETWEEN ? AND ? AND {FINITE} GROUP BY p.series) "
                 "SELECT sid, n, ft, lt, f.value, l.value, av, mx, l.count FROM agg "
                 "JOIN points f ON f.series = sid AND f.t = ft JOIN points l ON l.series = sid AND l.t = lt")
            for sid, *stats in db.execute(q, (metric, lo, hi)):
                out.append((by_id[sid], Summary(*(_number(x, f"a point of {metric}") for x in stats))))
        return out

    @staticmethod
    def _rebased(db: sqlite3.Connection, metric: str, lo: float, hi: float) -> list[tuple[int, Summary]]:
        """(series id, Summary over [lo, hi]) with cumulative series less their last value before `lo`."""
        q = ("SELECT p.series, COUNT(*), MIN(p.t), MAX(p.t), AVG(p.value), MAX(p.value), s.kind, s.temporality "
             f"FROM points p JOIN series s ON s.id = p.series WHERE s.metric = ? AND p.t BETWEEN ? AND ? AND {FINITE} "
             "GROUP BY p.series")
        out = []
        for sid, n, ft, lt, avg, mx, kind, temporality in db.execute(q, (metric, lo, hi)).fetchall():
            (fv, _), (lv, lc) = (db.execute("SELECT value, count FROM points WHERE series = ? AND t = ?", (sid, x)).fetchone()
                                 for x in (ft, lt))
            n, ft, lt, avg, mx, fv, lv, lc = (_number(x, f"a point of {metric}") for x in (n, ft, lt, avg, mx, fv, lv, lc))
            base = None
            if kind in ("counter", "histogram") and temporality != "delta":
                base = db.execute(f"SELECT p.value, p.count FROM points p WHERE p.series = ? AND p.t < ? AND {FINITE} "
                                  "ORDER BY p.t DESC LIMIT 1", (sid, lo)).fetchone()
                base = base and tuple(_number(x, f"a point of {metric}") for x in base)
            if base is not None and base[0] is not None and lv is not None and lv >= base[0]:   # no reset since
                b, bc = base
                fv, lv, avg, mx = (None if x is None else max(0.0, x - b) for x in (fv, lv, avg, mx))
                if lc is not None and bc is not None:
                    lc = max(0.0, lc - bc)
            out.append((sid, Summary(n, ft, lt, fv, lv, avg, mx, lc)))
        return out

    @staticmethod
    def _whole_run(db: sqlite3.Connection, meta: dict, lo: float, hi: float) -> bool:
        if not (meta.get("started") and meta.get("ended")):
            return False
        if not (lo <= float(meta["started"]) and hi >= float(meta["ended"])):
            return False
        return Recording._finite_stats(db)

    @staticmethod
    def _finite_stats(db: sqlite3.Connection, every: bool = False) -> bool:
        """The closed recording's per-series statistics are there and finite (no NaN or infinite point
        went into them); ``every``: and they cover every series."""
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'series_stats'").fetchone() is None or \
                db.execute("SELECT 1 FROM series_stats LIMIT 1").fetchone() is None:
            return False
        if every and db.execute("SELECT 1 FROM series s LEFT JOIN series_stats st ON st.series = s.id "
                                "WHERE st.series IS NULL LIMIT 1").fetchone() is not None:
            return False
        return db.execute("SELECT 1 FROM series_stats WHERE mean IS NULL OR mean IN (9e999, -9e999) "
                          "OR max IS NULL OR max IN (9e999, -9e999) LIMIT 1").fetchone() is None

    @_reads
    def profile_stacks(self) -> list[tuple[list[str], int, dict[str, str], str]]:
        """(stack root first, summed value, labels: the series' with the sample's on top, unit) per
        distinct stack and label set over the whole recording (read once, then kept; do not modify)."""
        if self._stacks is None:
            self._stacks = list(self._read_stacks())
        return self._stacks

    def _read_stacks(self) -> Iterator[tuple[list[str], int, dict[str, str], str]]:
        for db in self.dbs:
            frames = {sid: _frames(f) for sid, f in db.execute("SELECT id, frames FROM stacks")}
            labels: dict[tuple[str, str], dict[str, str]] = {}
            q = "SELECT profile_labels, sample_labels, stack, value, unit FROM stack_totals"
            for plabels, slabels, stack, value, unit in db.execute(q):
                both = labels.get((plabels, slabels))
                if both is None:
                    both = labels[(plabels, slabels)] = {**_object(plabels, "profile labels"),
                                                         **_object(slabels, "sample labels")}
                if stack not in frames or value.__class__ is not int:
                    raise ContentError(f"a profile total names no stack or is not a whole number: {str(value)[:40]!r}")
                yield frames[stack], value, both, str(unit)

    @_reads
    def profile_count(self) -> int:
        return sum(db.execute("SELECT count(*) FROM profiles").fetchone()[0] for db in self.dbs)
