"""Every output path kind, through the one writer (otel_gpu/output.py) and the commands that use it:
a file keeps its mode and owner, a link stays a link, devices and pipes are written through, a
folder or an input is refused before anything is written, nothing half-written is left."""
from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu import output
from otel_gpu.cli import main
from otel_gpu.errors import UsageError
from tests.childenv import REPO, clean_env
from tests.record.synth import write_node

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="making device nodes and giving files away needs root")
CLEAN_TRACES = REPO / "tests/data/traces/cpu_gloo_clean"


def _device(path: Path, minor: int) -> Path:
    """A character device node of the memory driver (major 1): 3 is null, 7 is full."""
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _read_fifo(path: Path, box: list) -> threading.Thread:
    def read():
        with open(path, "rb") as fh:
            box.append(fh.read())
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


# ---- the writer itself ----

def test_a_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o027)
    try:
        output.write(tmp_path / "new.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640
    assert (tmp_path / "new.json").read_text() == "{}"


def test_an_existing_file_keeps_its_mode(tmp_path):
    p = tmp_path / "out.html"
    p.write_text("old")
    p.chmod(0o640)
    output.write(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == 0o640


@needs_root
def test_another_users_file_keeps_its_owner(tmp_path):
    p = tmp_path / "theirs.json"
    p.write_text("old")
    os.chown(p, 65534, 65534)
    p.chmod(0o664)
    output.write(p, "new")
    s = p.stat()
    assert (s.st_uid, s.st_gid, stat.S_IMODE(s.st_mode)) == (65534, 65534, 0o664) and p.read_text() == "new"


def test_a_link_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "real" / "report.html"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    output.write(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target) and target.read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["link.html", "real"] and os.listdir(target.parent) == ["report.html"]


def test_a_dangling_link_gets_its_target_created(tmp_path):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "target.json")
    output.write(link, "x")
    assert link.is_symlink() and (tmp_path / "target.json").read_text() == "x"


@needs_root
def test_a_null_device_is_written_through(tmp_path):
    null = _device(tmp_path / "null", 3)
    output.write(null, "x" * 100_000)
    assert stat.S_ISCHR(null.stat().st_mode) and os.listdir(tmp_path) == ["null"]


@needs_root
def test_a_full_device_is_a_one_line_failure_and_stays_a_device(tmp_path):
    full = _device(tmp_path / "full", 7)
    with pytest.raises(OSError) as exc:
        output.write(full, "x")
    assert exc.value.errno == errno.ENOSPC and exc.value.filename == str(full)
    assert stat.S_ISCHR(full.stat().st_mode) and os.listdir(tmp_path) == ["full"]


def test_a_named_pipe_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    box: list = []
    reader = _read_fifo(fifo, box)
    output.write(fifo, "through the pipe")
    reader.join(10)
    assert box == [b"through the pipe"] and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_folder_is_refused(tmp_path):
    with pytest.raises(UsageError, match="is a folder"):
        output.write(tmp_path, "x")


def test_an_input_is_refused_by_any_name(tmp_path):
    src = tmp_path / "in.json"
    src.write_text("input")
    (tmp_path / "hard.json").hardlink_to(src)
    (tmp_path / "soft.json").symlink_to(src)
    for name in ("in.json", "hard.json", "soft.json"):
        with pytest.raises(UsageError, match="is an input"):
            output.write(tmp_path / name, "x", inputs=[src])
    assert src.read_text() == "input"


def test_several_outputs_are_all_or_nothing(tmp_path):
    keep = tmp_path / "a.json"
    keep.write_text("old")
    with pytest.raises(UsageError):
        output.write_all([(keep, "new"), (tmp_path, "x")])
    assert keep.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["a.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    """A real write error (the file size limit, EFBIG) while the temporary file is written."""
    p = tmp_path / "out.json"
    p.write_text("old")
    code = ("import resource, signal, sys; from otel_gpu import output\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            "try:\n    output.write(sys.argv[1], 'x' * 100000)\n"
            "except OSError as exc:\n    print(exc.errno)\n")
    done = subprocess.run([sys.executable, "-c", code, str(p)], env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == str(errno.EFBIG), done.stderr
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_exclusive_never_replaces(tmp_path):
    p = tmp_path / "cfg.json"
    output.write(p, "first", exclusive=True)
    with pytest.raises(FileExistsError):
        output.write(p, "second", exclusive=True)
    assert p.read_text() == "first"


KINDS = ["new", "file", "link", "dangling", "folder", "fifo", "input", "null"]


def _make(root: Path, kind: str, mode: int) -> tuple[Path, Path | None]:
    """(the output path, the file that should hold the text afterwards)."""
    p = root / "out"
    if kind == "file":
        p.write_text("old")
        p.chmod(mode)
        return p, p
    if kind == "link":
        (root / "t").write_text("old")
        (root / "t").chmod(mode)
        p.symlink_to(root / "t")
        return p, root / "t"
    if kind == "dangling":
        p.symlink_to(root / "t")
        return p, root / "t"
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "input":
        p.write_text("old")
    elif kind == "null":
        _device(p, 3)
    return p, (p if kind == "new" else None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(KINDS if ROOT else [k for k in KINDS if k != "null"]),
       mode=st.sampled_from([0o600, 0o640, 0o644, 0o664, 0o400]), text=st.text(max_size=200))
def test_every_path_kind_keeps_its_kind(kind, mode, text):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        p, holder = _make(root, kind, mode)
        before = os.lstat(p).st_mode if os.path.lexists(p) else None
        box: list = []
        reader = _read_fifo(p, box) if kind == "fifo" else None
        inputs = [p] if kind == "input" else []
        if kind in ("folder", "input"):
            with pytest.raises(UsageError):
                output.write(p, text, inputs=inputs)
            assert stat.S_IFMT(os.lstat(p).st_mode) == stat.S_IFMT(before)
            assert kind == "folder" or p.read_text() == "old"
            return
        output.write(p, text)
        if reader is not None:
            reader.join(10)
            assert box == [text.encode()]
        if before is not None:
            assert stat.S_IFMT(os.lstat(p).st_mode) == stat.S_IFMT(before)   # a link stays a link, a pipe a pipe
        if holder is not None:
            assert holder.read_bytes() == text.encode("utf-8")   # bytes: read_text would turn "\r" into "\n"
            if kind in ("file", "link"):
                assert stat.S_IMODE(holder.stat().st_mode) == mode
        assert not [f for f in os.listdir(root) if f.endswith(".tmp")]


# ---- the commands ----

@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("rec") / "run"
    write_node(d, "n1", [0], 1, time.time() - 100, 8)
    return d


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@needs_root
def test_report_to_dev_full_fails_in_one_line_and_dev_full_stays(run_dir, capsys):
    if not stat.S_ISCHR(os.stat("/dev/full").st_mode):
        pytest.skip("/dev/full is not a character device on this machine")
    assert main(["report", str(run_dir), "-o", "/dev/full"]) == 1
    assert "No space left on device" in _one_line(capsys)
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_report_to_dev_null_and_dev_stdout(run_dir, capsys):
    assert main(["report", str(run_dir), "-o", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    done = subprocess.run([sys.executable, "-m", "otel_gpu", "report", str(run_dir), "-o", "/dev/stdout"],
                          env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.lstrip().lower().startswith("<!doctype html"), done.stderr


def test_dev_stdout_redirected_to_a_file_writes_that_file(run_dir, tmp_path):
    """`... -o /dev/stdout > file`: the shell's file gets the report, nothing is renamed in its folder."""
    target = tmp_path / "redirected.html"
    with open(target, "w") as fh:
        done = subprocess.run([sys.executable, "-m", "otel_gpu", "report", str(run_dir), "-o", "/dev/stdout"],
                              env=clean_env(), cwd=REPO, stdout=fh, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert target.read_text().lstrip().lower().startswith("<!doctype html") and os.listdir(tmp_path) == [target.name]


def test_report_keeps_the_mode_and_the_link(run_dir, tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    out.chmod(0o640)
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o640 and out.read_text().startswith("<!")
    link = tmp_path / "link.html"
    link.symlink_to(out)
    assert main(["report", str(run_dir), "-o", str(link)]) == 0
    assert link.is_symlink() and stat.S_IMODE(out.stat().st_mode) == 0o640


@needs_root
def test_report_keeps_another_users_file_theirs(run_dir, tmp_path):
    out = tmp_path / "shared.html"
    out.write_text("old")
    os.chown(out, 65534, 65534)
    out.chmod(0o644)
    assert main(["report", str(run_dir), "-o", str(out)]) == 0
    s = out.stat()
    assert (s.st_uid, s.st_gid, stat.S_IMODE(s.st_mode)) == (65534, 65534, 0o644) and s.st_size > 1000


def test_report_refuses_to_overwrite_its_recording(run_dir, capsys):
    db = run_dir / "recording.sqlite"
    before = db.read_bytes()
    assert main(["report", str(run_dir), "-o", str(db)]) == 2
    assert "is an input" in _one_line(capsys)
    assert db.read_bytes() == before


def test_report_refuses_a_folder(run_dir, capsys):
    assert main(["report", str(run_dir), "-o", str(run_dir)]) == 2
    assert "is a folder" in _one_line(capsys)


def test_diagnose_refuses_its_thresholds_file_and_writes_through_a_pipe(run_dir, tmp_path, capsys):
    th = tmp_path / "t.toml"
    th.write_text("")
    assert main(["diagnose", str(run_dir), "--json", str(th), "--thresholds", str(th)]) == 2
    assert "--json" in _one_line(capsys) and th.read_text() == ""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    box: list = []
    reader = _read_fifo(fifo, box)
    assert main(["diagnose", str(run_dir), "--markdown", str(fifo)]) == 0
    reader.join(10)
    assert box and box[0].startswith(b"#") and stat.S_ISFIFO(fifo.stat().st_mode)


@needs_root
def test_diagnose_writes_through_a_null_device(run_dir, tmp_path):
    null = _device(tmp_path / "null", 3)
    assert main(["diagnose", str(run_dir), "--json", str(null)]) == 0
    assert stat.S_ISCHR(null.stat().st_mode)


def test_trace_analyze_never_overwrites_an_input_trace(tmp_path, capsys):
    d = tmp_path / "traces"
    shutil.copytree(CLEAN_TRACES, d)
    victim = d / "rank1.pt.trace.json.gz"
    before = victim.read_bytes()
    assert main(["trace", "analyze", str(d), "--quiet", "--json", str(victim)]) == 2
    assert "--json" in _one_line(capsys) and victim.read_bytes() == before
    assert main(["trace", "diff", str(CLEAN_TRACES), str(d), "--quiet", "--json", str(victim)]) == 2
    assert victim.read_bytes() == before


def test_trace_analyze_json_through_a_link(tmp_path):
    out = tmp_path / "o.json"
    out.write_text("old")
    out.chmod(0o600)
    link = tmp_path / "l.json"
    link.symlink_to(out)
    assert main(["trace", "analyze", str(CLEAN_TRACES), "--quiet", "--json", str(link)]) == 0
    assert link.is_symlink() and out.read_text().startswith("{") and stat.S_IMODE(out.stat().st_mode) == 0o600
