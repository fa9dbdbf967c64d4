"""The Grafana admin password file, read the way the container reads it: as uid 472.

Compose bind-mounts a file secret with its host owner and mode, and the Grafana image runs
as uid 472 (group 0), not as the host user who wrote the file. Here the file is made by root
(this test's user) following the documented steps, then `compose/grafana-start.sh` and
Grafana's own secret step (run.sh: `export VAR="$(cat "$FILE")"`) run under `setpriv` as uid
472. The container sees the file's inode, not the host folder it lies in, so the test reaches
it through a hard link in a world-traversable folder, as a bind mount would.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose"
GRAFANA_UID, GRAFANA_GID = 472, 0       # the grafana/grafana image's user and group
OTHER_UID = 64123                       # another user of the Docker host

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv to run the start script as another uid")

# The steps docs/deploy.md gave before compose/init-secrets.sh: the file ends up 0600.
OLD_STEPS = "umask 077; mkdir -p secrets; head -c 24 /dev/urandom | base64 > secrets/grafana_admin_password"


@pytest.fixture
def stack_dir():
    """A copy of compose/ in a folder every uid can traverse (pytest's tmp_path is 0700)."""
    top = Path(tempfile.mkdtemp(prefix="otelgpu-secret-"))
    top.chmod(0o755)
    shutil.copytree(COMPOSE, top / "compose", ignore=shutil.ignore_patterns(".env", "secrets"))
    for p in [top / "compose", *(top / "compose").iterdir()]:
        p.chmod(0o755 if p.is_dir() or p.suffix == ".sh" else 0o644)
    yield top
    shutil.rmtree(top)


def as_uid(uid: int, gid: int, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv],
                          env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True, timeout=20)


def mounted(stack: Path) -> Path:
    """What the container sees at /run/secrets/grafana_admin_password: the same inode."""
    run = stack / "run-secrets"
    run.mkdir(mode=0o755)
    os.link(stack / "compose" / "secrets" / "grafana_admin_password", run / "grafana_admin_password")
    return run / "grafana_admin_password"


def start_grafana(stack: Path, secret: Path) -> subprocess.CompletedProcess:
    env = {"GF_SECURITY_ADMIN_PASSWORD__FILE": str(secret)}
    return as_uid(GRAFANA_UID, GRAFANA_GID, ["/bin/sh", str(stack / "compose" / "grafana-start.sh")], env)


def grafana_reads_secret(secret: Path) -> subprocess.CompletedProcess:
    """Grafana's run.sh secret step (its `set -e` does not stop on it: `export` hides cat's status)."""
    script = 'set -e; export GF_SECURITY_ADMIN_PASSWORD="$(cat "$1")"; printf %s "$GF_SECURITY_ADMIN_PASSWORD"'
    return as_uid(GRAFANA_UID, GRAFANA_GID, ["/bin/sh", "-c", script, "run.sh", str(secret)], {})


def test_the_old_steps_leave_grafana_unable_to_read_its_password(stack_dir):
    subprocess.run(["/bin/sh", "-c", OLD_STEPS], cwd=stack_dir / "compose", check=True)
    secret = mounted(stack_dir)
    assert secret.stat().st_mode & 0o777 == 0o600
    out = start_grafana(stack_dir, secret)
    assert out.returncode == 1, out
    assert out.stderr.startswith(f"otel-gpu: uid {GRAFANA_UID} cannot read") and out.stderr.count("\n") == 1
    # without the start script, Grafana's own entrypoint would carry on with an empty password
    unguarded = grafana_reads_secret(secret)
    assert unguarded.returncode == 0 and unguarded.stdout == "" and "Permission denied" in unguarded.stderr


def test_init_secrets_gives_grafana_its_password_and_nobody_else(stack_dir):
    compose = stack_dir / "compose"
    out = subprocess.run(["/bin/sh", str(compose / "init-secrets.sh")], cwd="/",
                         capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    password = (compose / "secrets" / "grafana_admin_password").read_text().strip()
    assert len(password) >= 32
    assert (compose / "secrets").stat().st_mode & 0o777 == 0o700
    assert (compose / ".env").read_text() == (compose / ".env.example").read_text()
    secret = mounted(stack_dir)
    started = start_grafana(stack_dir, secret)
    # past every check it execs Grafana's entrypoint, which this machine does not have
    assert started.returncode == 127 and "/run.sh" in started.stderr and "otel-gpu:" not in started.stderr
    assert grafana_reads_secret(secret).stdout.strip() == password
    # another user of the host cannot reach the file through its 0700 folder
    other = as_uid(OTHER_UID, OTHER_UID, ["cat", str(compose / "secrets" / "grafana_admin_password")], {})
    assert other.returncode != 0 and "Permission denied" in other.stderr


def test_init_secrets_keeps_an_existing_password_and_repairs_modes(stack_dir):
    compose = stack_dir / "compose"
    subprocess.run(["/bin/sh", "-c", OLD_STEPS], cwd=compose, check=True)
    before = (compose / "secrets" / "grafana_admin_password").read_text()
    (compose / "secrets").chmod(0o755)
    subprocess.run(["/bin/sh", str(compose / "init-secrets.sh")], check=True, capture_output=True)
    assert (compose / "secrets" / "grafana_admin_password").read_text() == before
    assert (compose / "secrets").stat().st_mode & 0o777 == 0o700
    assert (compose / "secrets" / "grafana_admin_password").stat().st_mode & 0o777 == 0o644
    assert start_grafana(stack_dir, mounted(stack_dir)).returncode == 127


def test_the_documented_steps_use_init_secrets():
    for doc in (REPO / "docs" / "deploy.md", REPO / "README.md", COMPOSE / "docker-compose.yml",
                COMPOSE / ".env.example"):
        text = doc.read_text()
        assert "init-secrets.sh" in text, doc
        assert "> secrets/grafana_admin_password" not in text, f"{doc}: still has the 0600 recipe"
