"""Many outputs written as one (otel_gpu/output.write_all): items and their text given piece by
piece, one sync for the batch (syncfs, or fsync per file where it is missing or fails), and still
nothing half-written when anything fails on the way."""
from __future__ import annotations

import os
import stat

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu import output

ROOT = os.geteuid() == 0


def _pieces(text: str, cuts: list[int]):
    """``text`` cut at ``cuts`` (sorted positions), as a generator of str and bytes pieces."""
    last = 0
    for i, c in enumerate(sorted(set(cuts)) + [len(text)]):
        piece = text[last:c]
        yield piece.encode() if i % 2 else piece
        last = c


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=8))
def test_a_text_in_pieces_is_the_same_file(tmp_path, text, cuts):
    cuts = [c for c in cuts if c <= len(text)]
    p = tmp_path / "t.csv"
    output.write_all([(p, _pieces(text, cuts))])
    assert p.read_bytes() == text.encode() and os.listdir(tmp_path) == ["t.csv"]


def _batch(tmp_path, n: int):
    return ((tmp_path / f"f{i}.csv", (f"{i},{j}\n" for j in range(100))) for i in range(n))


def _check_batch(tmp_path, n: int):
    assert sorted(os.listdir(tmp_path)) == sorted(f"f{i}.csv" for i in range(n))
    for i in range(n):
        assert (tmp_path / f"f{i}.csv").read_text() == "".join(f"{i},{j}\n" for j in range(100))


def test_a_large_batch_from_a_generator_is_written_whole(tmp_path):
    n = output.BATCH_SYNC_MIN * 3
    paths = output.write_all(_batch(tmp_path, n), labels=(f"--csv {i}" for i in range(n)))
    assert len(paths) == n
    _check_batch(tmp_path, n)


@pytest.mark.parametrize("syncfs", ["missing", "fails"])
def test_without_syncfs_every_file_is_fsynced(tmp_path, monkeypatch, syncfs):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else fd)
        real_fsync(fd)
    monkeypatch.setattr(output, "_syncfs_call", (lambda: None) if syncfs == "missing" else (lambda: lambda fd: -1))
    monkeypatch.setattr(os, "fsync", fsync)
    n = output.BATCH_SYNC_MIN + 2
    output.write_all(_batch(tmp_path, n))
    _check_batch(tmp_path, n)
    assert len(synced) == n   # one per staged temporary file, before any rename


def test_syncfs_is_used_once_for_a_large_batch(tmp_path, monkeypatch):
    calls = []
    real = output._syncfs_call()
    if real is None:
        pytest.skip("syncfs is Linux-only: this platform has no syncfs to call")
    monkeypatch.setattr(output, "_syncfs_call", lambda: (lambda fd: calls.append(fd) or real(fd)))
    monkeypatch.setattr(os, "fsync", lambda fd: pytest.fail("fsync called although syncfs worked"))
    output.write_all(_batch(tmp_path, output.BATCH_SYNC_MIN))
    assert len(calls) == 1
    _check_batch(tmp_path, output.BATCH_SYNC_MIN)


def test_a_failure_midway_leaves_everything_as_it_was(tmp_path):
    (tmp_path / "f0.csv").write_text("old")

    def items():
        yield from _batch(tmp_path, 5)
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError):
        output.write_all(items())
    assert os.listdir(tmp_path) == ["f0.csv"] and (tmp_path / "f0.csv").read_text() == "old"


def test_a_failing_piece_leaves_no_temporary(tmp_path):
    def pieces():
        yield "a,b\n"
        raise ValueError("bad row")
    with pytest.raises(ValueError):
        output.write_all([(tmp_path / "a.csv", "x"), (tmp_path / "b.csv", pieces())])
    assert os.listdir(tmp_path) == []


def test_pieces_through_a_device_are_joined(tmp_path):
    output.write_all([("/dev/null", (s for s in ("a", b"b", "c")))])   # written through at commit


@pytest.mark.skipif(not ROOT, reason="giving a file to another user needs root")
def test_pieces_for_a_file_that_cannot_be_given_back_are_rewritten_in_place(tmp_path, monkeypatch):
    """fchown refused (as for a user writing another user's file): the text written in pieces to
    the temporary file is read back and the file rewritten in place, keeping its owner."""
    p = tmp_path / "other.csv"
    p.write_text("old")
    os.chown(p, 12345, 12345)

    def fchown(fd, uid, gid):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(os, "fchown", fchown)
    output.write_all([(p, (f"{j}\n" for j in range(1000)))])
    st_ = os.stat(p)
    assert (st_.st_uid, st_.st_gid) == (12345, 12345) and stat.S_ISREG(st_.st_mode)
    assert p.read_text() == "".join(f"{j}\n" for j in range(1000)) and os.listdir(tmp_path) == ["other.csv"]


def test_staged_ahead_is_committed_with_the_rest(tmp_path):
    """What `stage` wrote (possibly in another process) is put in place by `write_all` with the
    other outputs: same bytes, same mode rules, no temporary file left."""
    (tmp_path / "old.csv").write_text("old")
    os.chmod(tmp_path / "old.csv", 0o640)
    ahead = [output.stage(output.plan(os.fspath(tmp_path / n)), f"{n} text\n", tag="t1")
             for n in ("new.csv", "old.csv")]
    assert all(s.tmp and ".t1." in os.path.basename(s.tmp) for s in ahead)
    assert (tmp_path / "old.csv").read_text() == "old"   # nothing in place before write_all
    output.write_all([(tmp_path / "a.csv", "a\n"), (os.fspath(tmp_path / "new.csv"), ahead[0]),
                      (os.fspath(tmp_path / "old.csv"), ahead[1])])
    assert sorted(os.listdir(tmp_path)) == ["a.csv", "new.csv", "old.csv"]
    assert (tmp_path / "new.csv").read_text() == "new.csv text\n"
    assert (tmp_path / "old.csv").read_text() == "old.csv text\n"
    assert stat.S_IMODE(os.stat(tmp_path / "old.csv").st_mode) == 0o640


def test_staged_ahead_is_discarded_when_the_batch_fails(tmp_path):
    ahead = output.stage(output.plan(os.fspath(tmp_path / "r0.csv")), "x\n", tag="t2")

    def items():
        yield os.fspath(tmp_path / "r0.csv"), ahead
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError):
        output.write_all(items())
    assert os.listdir(tmp_path) == []


def test_staged_ahead_for_another_path_is_refused(tmp_path):
    ahead = output.stage(output.plan(os.fspath(tmp_path / "r0.csv")), "x\n")
    with pytest.raises(ValueError, match="staged for"):
        output.write_all([(os.fspath(tmp_path / "r1.csv"), ahead)])
    assert os.listdir(tmp_path) == []


def test_discard_tagged_removes_only_that_tag(tmp_path):
    """What a process that died after `stage(..., tag=T)` left is found by its tag; nothing else is touched."""
    mine = [output.stage(output.plan(os.fspath(tmp_path / f"r{i}.csv")), "x\n", tag="deadbeef") for i in range(3)]
    other = output.stage(output.plan(os.fspath(tmp_path / "r0.csv")), "y\n", tag="cafe")
    (tmp_path / "keep.csv").write_text("k")
    (tmp_path / ".hidden.tmp").write_text("h")
    output.discard_tagged(os.fspath(tmp_path), "deadbeef")
    assert not any(os.path.exists(s.tmp) for s in mine) and os.path.exists(other.tmp)
    assert sorted(os.listdir(tmp_path)) == sorted([".hidden.tmp", "keep.csv", os.path.basename(other.tmp)])
    output.discard_tagged(os.fspath(tmp_path / "gone"), "deadbeef")   # a folder that is not there: nothing to do
