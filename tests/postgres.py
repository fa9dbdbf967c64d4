"""A throwaway PostgreSQL cluster for tests: initdb into a fresh folder, the server on a free loopback
port, stopped by PID at the end.

PostgreSQL refuses to run as root: when the tests run as root, the cluster belongs to the `postgres`
system user (Debian's package creates it) and its folder is a private one under the system temp dir
(pytest's own temp dirs are mode 0700 for root, so that user could not reach them). Authentication is
`trust`, which is safe only because the server listens on 127.0.0.1 and on a socket in that private
folder, and lives as long as the test session.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from servers import free_port

PG_BIN = os.environ.get("OTELGPU_PG_BIN") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)), "")


class PostgresError(RuntimeError):
    """The cluster did not initialise or start; the message carries the log tail."""


class Postgres:
    """`start()` then `url(database)`; `create_database(name)`; `stop()` ends the server and removes its folder."""

    start_timeout = 30.0

    def __init__(self, bin_dir: str = PG_BIN):
        self.bin = Path(bin_dir)
        self.port = free_port()
        self.user = pwd.getpwuid(os.getuid()).pw_name if os.getuid() else "postgres"
        self.dir = Path(tempfile.mkdtemp(prefix="otelgpu-pg-"))
        self.proc: subprocess.Popen | None = None

    @classmethod
    def available(cls, bin_dir: str = PG_BIN) -> bool:
        ok = bool(bin_dir) and os.access(Path(bin_dir) / "postgres", os.X_OK)
        return ok and (os.getuid() != 0 or _has_user("postgres"))

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> "Postgres":
        if os.getuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run([str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-U", self.user, "--auth=trust",
                   "--no-sync", "--no-instructions", "-E", "UTF8", "--locale=C"])
        log = open(self.dir / "server.log", "ab")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.dir / "data"), "-k", str(self.dir), "-h", "127.0.0.1",
             "-p", str(self.port), "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            **self._as_owner())
        log.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PostgresError(f"postgres exited with status {self.proc.returncode}; log tail:\n{self.log_tail()}")
            ready = subprocess.run([str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if ready.returncode == 0:
                return self
            time.sleep(0.1)
        self.stop()
        raise PostgresError(f"postgres not ready within {self.start_timeout:g} s; log tail:\n{self.log_tail()}")

    def create_database(self, name: str) -> str:
        """A new empty database (name: letters, digits, _); returns its URL."""
        if not name.replace("_", "").isalnum():
            raise ValueError(f"database name {name!r}: letters, digits and _ only")
        self._run([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, name])
        return self.url(name)

    def stop(self, timeout: float = 10.0) -> None:
        """Immediate shutdown (SIGQUIT: the cluster is thrown away, no checkpoint needed) by PID, then SIGKILL;
        the folder is removed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join((self.dir / "server.log").read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def _as_owner(self) -> dict:
        return {"user": "postgres", "group": "postgres", "extra_groups": []} if os.getuid() == 0 else {}

    def _run(self, argv: list[str]) -> None:
        done = subprocess.run(argv, cwd=self.dir, capture_output=True, text=True, timeout=60, **self._as_owner())
        if done.returncode:
            raise PostgresError(f"{Path(argv[0]).name} failed ({done.returncode}): {(done.stderr or done.stdout)[-800:]}")


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
