"""The study's storage, shared by tuners on one or several nodes, and resume from it.

Every trial's owner (host, tuner pid and start time), process group and heartbeat are kept in
the study. A RUNNING trial whose tuner is gone (same host: the pid is dead or reused;
elsewhere: no heartbeat for `stale_after_s`) is retired: its leftover process group is killed,
it is marked failed ("interrupted", not counted) and its exact parameters are enqueued again.
So a killed tuner, started again with the same arguments, loses no trial and repeats none.
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial, TrialState

from . import trial as T
from .sampler import SAMPLED


# the advisory lock's key: one for every otel-gpu tuner of a database (64-bit, signed)
PG_LOCK_KEY = int.from_bytes(b"otelgpuT", "big", signed=True)


class TuneError(RuntimeError):
    """A problem that stops the tuner (one line)."""


def storage_url(study: str | os.PathLike) -> str:
    """A path -> `sqlite:///<absolute path>`; a URL (postgresql://, mysql://, sqlite://) unchanged."""
    text = str(study)
    return text if "://" in text else "sqlite:///" + str(Path(text).resolve())


def shown_url(url: str) -> str:
    """The storage URL as printed: a password in it replaced by ***."""
    if "://" not in url or url.startswith("sqlite"):
        return url
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):   # not a URL it parses: show nothing after the scheme
        return url.split("://", 1)[0] + "://..."


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """The RDB storage at `url`; a bare `postgresql://` uses psycopg 3 (the `postgres` extra), whatever
    SQLAlchemy's default driver (psycopg2 before 2.1); `postgresql+<driver>://` picks another."""
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    shown = shown_url(url)
    if url.startswith("postgresql://"):
        if importlib.util.find_spec("psycopg") is None:
            raise TuneError(f"cannot open study storage {shown}: the PostgreSQL driver psycopg is not installed "
                            "(pip install 'otel-gpu[postgres]')")
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    for attempt in range(3):   # workers starting together race to create the tables: retry
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        except Exception as exc:   # SQLAlchemy raises many kinds; say which storage and why
            if attempt == 2:
                why = " ".join(str(exc).split()).replace(url, shown)[:200]
                raise TuneError(f"cannot open study storage {shown}: {why}") from None
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


@contextmanager
def storage_lock(url: str, storage: optuna.storages.RDBStorage | None = None):
    """Serialize counting, ask() and retiring between the tuners of one study storage, so that two
    workers neither pop the same queued trial nor both start the last trial of the budget.
    SQLite: a file lock beside the database (SQLite has no SELECT ... FOR UPDATE). PostgreSQL (`storage`
    given): a session advisory lock on a connection of its own, which the server drops with the
    connection if the tuner dies. Other servers: none (Optuna's row locks still keep a queued trial
    from being popped twice; the budget may be overshot by one trial per extra worker)."""
    if url.startswith("sqlite:///"):
        with open(url[len("sqlite:///"):] + ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    elif storage is not None and storage.engine.dialect.name == "postgresql":
        with storage.engine.connect() as con:
            con.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": PG_LOCK_KEY})
            try:
                yield
            finally:
                con.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": PG_LOCK_KEY})
    else:
        yield


def owner() -> dict[str, Any]:
    """This tuner, as kept on the trials it runs: host, pid and the pid's start time."""
    return {"host": socket.gethostname(), "tuner_pid": os.getpid(), "tuner_start": T.start_time(os.getpid())}


def _alive(pid: int | None, start: int | None) -> bool:
    return pid is not None and T.start_time(pid) is not None and T.start_time(pid) == start


def retire_stale(study: optuna.Study, stale_after_s: float, grace_s: float) -> list[int]:
    """Retire RUNNING trials whose tuner is gone (hold `storage_lock` around it); returns their numbers."""
    me, now, retired = owner(), time.time(), []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        a = t.user_attrs
        if a.get("tuner_pid") == me["tuner_pid"] and a.get("host") == me["host"]:
            continue                                        # ours (this process)
        started = t.datetime_start.timestamp() if t.datetime_start else now
        if "host" not in a:                                 # asked, never set up: its tuner died at once
            stale = now - started > 30
        elif a.get("host") == me["host"]:
            stale = not _alive(a.get("tuner_pid"), a.get("tuner_start"))
        else:
            beat = a.get("heartbeat") or started
            stale = now - beat > stale_after_s
        if stale and retire(study, t, "its tuner stopped before the trial ended", grace_s):
            retired.append(t.number)
    return retired


def retire(study: optuna.Study, t: FrozenTrial, why: str, grace_s: float) -> bool:
    """Kill the trial's leftover group (this host), mark it interrupted and queue its parameters
    again; False when another worker retired it first."""
    a, storage = t.user_attrs, study._storage
    if a.get("host") == socket.gethostname() and a.get("pgid") and \
            T.group_is_trial(a["pgid"], a.get("pg_start"), a.get("trial_id")):
        T.kill_group(a["pgid"], grace_s)
    try:
        storage.set_trial_user_attr(t._trial_id, "status", T.INTERRUPTED)
        storage.set_trial_user_attr(t._trial_id, "reason", why + "; its parameters were queued again")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
    except RuntimeError:          # UpdateFinishedTrialError: another worker retired it first
        return False
    retry = {"role": a.get("role", SAMPLED), "retry_of": t.number}
    study.enqueue_trial(dict(t.params), user_attrs=retry)
    return True
