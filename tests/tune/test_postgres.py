"""The tuner on several workers sharing one study on a real PostgreSQL server (the `postgres` fixture:
a throwaway cluster on loopback): one worker SIGKILLed mid-trial loses no trial and repeats none."""
import json
import string
import subprocess
import time
from urllib.parse import quote

import optuna
import pytest
from hypothesis import given, settings, strategies as st
from optuna.trial import TrialState
from servers import free_port

from otel_gpu.tune import trial as T
from otel_gpu.tune.storage import TuneError, open_storage, retire_stale, shown_url, storage_lock

from .helpers import CLI, REPO, clean_env, copy_base, fake_command

HELD = 1     # this trial runs until its tuner is killed (at most --hold-s)
TRIALS = 4


def _running(url: str, number: int, timeout: float = 30.0) -> dict:
    """The user attributes of trial `number` once it runs with its process group recorded."""
    storage = open_storage(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            study = optuna.load_study(study_name="t", storage=storage)
            trials = {t.number: t for t in study.get_trials(deepcopy=False)}
            t = trials.get(number)
            if t is not None and t.state == TrialState.RUNNING and t.user_attrs.get("pgid"):
                return dict(t.user_attrs)
        except KeyError:          # the study is not created yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"trial {number} never started")


@pytest.fixture(scope="module")
def db(postgres):
    """One database for this module's studies (each test names its own), its schema made once."""
    url = postgres.create_database("tune_tests")
    return url, open_storage(url)


def test_two_tuners_one_killed_mid_trial(db, tmp_path):
    url, _ = db
    base = copy_base(tmp_path)
    out = tmp_path / "out"
    command = fake_command("--trial {trial}", f"--hold-trials {HELD}", "--hold-s 60", steps=5)
    argv = CLI + ["tune", "--base-config", str(base), "--command", command, "--trials", str(TRIALS), "--study", url,
                  "--out", str(out), "--study-name", "t", "--hidden-size", "64", "--no-prune", "--seed", "5",
                  "--warmup-steps", "1", "--min-steps", "3", "--trial-timeout", "60", "--no-deepspeed-check",
                  "--no-instrument"]
    procs = [subprocess.Popen(argv, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    try:
        attrs = _running(url, HELD)
        killed = next(p for p in procs if p.pid == attrs["tuner_pid"])
        survivor = next(p for p in procs if p is not killed)
        assert survivor.poll() is None, survivor.communicate()[0]   # it still has trials to run
        killed.kill()
        killed.communicate(timeout=10)
        assert T.group_alive(attrs["pgid"])      # the trial's group outlives its tuner...
        text, _ = survivor.communicate(timeout=90)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert survivor.returncode == 0, text
    assert not T.group_alive(attrs["pgid"])      # ...until the other tuner retires the trial

    trials = optuna.load_study(study_name="t", storage=open_storage(url)).get_trials()
    held = trials[HELD]
    assert held.state == TrialState.FAIL and held.user_attrs["status"] == T.INTERRUPTED
    assert held.user_attrs["tuner_pid"] == killed.pid
    finished = [t for t in trials if t.state != TrialState.WAITING and t.number != HELD]
    assert len(finished) == TRIALS, [(t.number, t.state) for t in trials]          # the budget, exactly
    assert all(t.user_attrs["status"] == "ok" and t.state == TrialState.COMPLETE for t in finished)
    retries = [t for t in finished if t.user_attrs.get("retry_of") == HELD]
    assert len(retries) == 1 and retries[0].params == held.params
    assert retries[0].user_attrs["tuner_pid"] == survivor.pid
    # every trial ran once, in its own folder; parameters repeat only for the planned baseline
    # repeat and the retry of the killed trial
    assert sorted(p.name for p in (out / "trials").iterdir()) == [f"{t.number:04d}" for t in trials
                                                                  if t.state != TrialState.WAITING]
    keys = [json.dumps(t.params, sort_keys=True) for t in finished if t.user_attrs.get("repeat", 0) == 0
            and t.user_attrs.get("retry_of") is None]
    assert len(set(keys)) == len(keys)
    assert "interrupted" in (out / "report.md").read_text()


def test_a_silent_tuner_on_another_node_is_retired_after_its_heartbeat_stops(db):
    """Another node's tuner cannot be checked by pid: its trial is retired once its heartbeat is older
    than stale_after_s, and not before; its parameters are queued again once, with the lock held."""
    url, storage = db
    study = optuna.create_study(storage=storage, study_name="stale")
    beats = {"quiet": time.time() - 400, "beating": time.time() - 10}
    for name, beat in beats.items():
        trial = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
        for k, v in {"host": "node-b.invalid", "tuner_pid": 1, "tuner_start": 1, "heartbeat": beat,
                     "role": name}.items():
            trial.set_user_attr(k, v)
    with storage_lock(url, storage):
        retired = retire_stale(study, stale_after_s=300, grace_s=1)
    with storage_lock(url, storage):
        assert retire_stale(study, stale_after_s=300, grace_s=1) == []        # once only
    by_role = {t.user_attrs.get("role"): t for t in study.get_trials() if t.state != TrialState.WAITING}
    assert retired == [by_role["quiet"].number]
    assert by_role["quiet"].state == TrialState.FAIL and by_role["quiet"].user_attrs["status"] == T.INTERRUPTED
    assert by_role["beating"].state == TrialState.RUNNING
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in queued] == [by_role["quiet"].params]
    assert queued[0].user_attrs["retry_of"] == by_role["quiet"].number


def test_the_advisory_lock_excludes_a_second_holder(db):
    """While one tuner holds the study lock another waits for it (a second connection cannot take it)."""
    import psycopg

    from otel_gpu.tune.storage import PG_LOCK_KEY

    url, storage = db
    other = psycopg.connect(url, autocommit=True)
    try:
        cur = other.cursor()
        with storage_lock(url, storage):
            cur.execute("SELECT pg_try_advisory_lock(%s)", (PG_LOCK_KEY,))
            assert cur.fetchone()[0] is False
        cur.execute("SELECT pg_try_advisory_lock(%s)", (PG_LOCK_KEY,))
        assert cur.fetchone()[0] is True
    finally:
        other.close()


@settings(max_examples=40, deadline=None)
@given(user=st.text(alphabet=string.ascii_letters, min_size=1, max_size=8),
       password=st.text(alphabet=string.ascii_letters + string.digits + "!$&'()*+,;=-._~", min_size=4, max_size=20),
       host=st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5})?", fullmatch=True))
def test_a_password_in_the_storage_url_is_never_shown(user, password, host):
    url = f"postgresql://{user}:{quote(password, safe='')}@{host}:5432/tuning"
    shown = shown_url(url)
    assert quote(password, safe="") not in shown.split("@")[0].split(":", 2)[-1]
    assert shown == f"postgresql://{user}:***@{host}:5432/tuning"


def test_a_missing_driver_or_server_is_one_line_without_the_password(tmp_path):
    port = free_port()      # nothing listens there
    with pytest.raises(TuneError) as err:
        open_storage(f"postgresql://tuner:s3cret@127.0.0.1:{port}/tuning")
    text = str(err.value)
    assert "s3cret" not in text and "\n" not in text
    assert text.startswith(f"cannot open study storage postgresql://tuner:***@127.0.0.1:{port}/tuning: ")
