"""Shared bits of the tuner tests: paths, a clean environment, a VictoriaMetrics flusher."""
from __future__ import annotations

import shutil
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from tests.childenv import clean_env  # noqa: F401  (re-exported to the tune tests)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DATA = REPO / "tests" / "data" / "deepspeed"
FAKE = HERE / "fake_train.py"
EXAMPLE = REPO / "examples" / "tune" / "train_zero3.py"
Z3 = DATA / "llamafactory_ds_z3_config.json"
CLI = [sys.executable, "-m", "otel_gpu"]


def copy_base(tmp_path: Path, source: Path = Z3) -> Path:
    dst = tmp_path / "ds_config.json"
    shutil.copyfile(source, dst)
    return dst


def fake_command(*extra: str, steps: int = 10) -> str:
    return " ".join([sys.executable, str(FAKE), "--deepspeed", "{config}", "--steps", str(steps), *extra])


@contextmanager
def flushing(vm, every_s: float = 0.3):
    """Flush VictoriaMetrics' in-memory buffers continually while the block runs, so fresh
    series become queryable within a fraction of a second (as a tuned production setup's would)."""
    stop = threading.Event()

    def loop():
        while not stop.wait(every_s):
            try:
                vm.flush()
            except Exception:   # the server may be stopping at session end; the test asserts on results
                return

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def schema_ready(db) -> bool:
    """The study database exists with Optuna's tables (read-only look, creates nothing)."""
    import sqlite3

    if not db.exists():
        return False
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
            names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"studies", "trials", "trial_user_attributes", "version_info", "alembic_version"} <= names:
                return False
            # Optuna stamps the schema's revision last: a reader opening the storage before that stamps it
            # too, and one of the two inserts fails (UNIQUE constraint on alembic_version)
            return con.execute("SELECT COUNT(*) FROM alembic_version").fetchone()[0] > 0
    except sqlite3.Error:
        return False
