"""Writing an output file the user named (a report, a JSON result, a config) without destroying
what is at that path.

One rule for every command that writes a file:

- a regular file, or a new name, is replaced whole: the text goes to a temporary file in the same
  folder, is flushed to disk (fsync; for many files written as one, a single syncfs of their
  filesystem, see `write_all`), then renamed over the name. An existing file keeps its mode
  and its owner and group (set on the temporary file first; where that is not allowed, a non-root
  user writing another user's file, the file is rewritten in place instead); a new file gets
  0666 minus the umask. A failure leaves the old file as it was and no temporary file behind
  (except when rewritten in place: a write that fails there, a full disk, leaves it cut short);
- a symbolic link is followed: its target is written that way and the link stays a link;
- a character device (/dev/null, /dev/full, a terminal), a named pipe, or a name that leads into
  /proc (/dev/stdout, /dev/fd/N) is written through, as a shell redirect does: opened for writing,
  never renamed over nor created. "No space left" there (/dev/full) is an OSError like any other;
- a folder, a block device or a socket is refused (UsageError, exit 2), and so is a path that is
  one of the command's inputs (the same file, by device and inode), before anything is written.
"""
from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .errors import UsageError

REPLACE, THROUGH, IN_PLACE = "replace", "through", "in place"
_PATH_ERRORS = (errno.ELOOP, errno.ENOTDIR, errno.ENAMETOOLONG)


@dataclass(frozen=True)
class Target:
    """Where and how one output is written. `real`: the file written (a link's target);
    `st`: the existing file's status, None for a new file."""
    path: str
    kind: str
    real: str
    st: os.stat_result | None
    fd: int | None = None   # THROUGH a descriptor of this process (/dev/stdout): written to it directly


def _refuse(label: str, why: str) -> UsageError:
    return UsageError(f"{label}: {why}")


_FD_DIR = re.compile(r"/proc/(\d+)(?:/task/\d+)?/fd")


def _via_proc(path: str) -> tuple[bool, int | None]:
    """(True, N) for a name of this process's descriptor N (/dev/stdout, /dev/fd/1, /proc/self/fd/1),
    (True, None) for another name leading into /proc, (False, None) otherwise: what leads into /proc
    is written through, never renamed over; descriptor N is written at its own offset (after what
    this process already printed there)."""
    q = os.path.abspath(path)
    for _ in range(40):
        parent = os.path.realpath(os.path.dirname(q))
        if parent.startswith("/proc/"):
            m = _FD_DIR.fullmatch(parent)
            own = m is not None and int(m.group(1)) == os.getpid() and os.path.basename(q).isdigit()
            return True, int(os.path.basename(q)) if own else None
        if not os.path.islink(q):
            return False, None
        q = os.path.normpath(os.path.join(os.path.dirname(q), os.readlink(q)))
    return False, None


def input_ids(inputs: Iterable) -> dict[tuple[int, int], str]:
    """(device, inode) -> name of each input that exists (stat once, however many outputs)."""
    ids: dict[tuple[int, int], str] = {}
    for i in inputs:
        try:
            s = os.stat(i)
        except OSError:
            continue
        ids.setdefault((s.st_dev, s.st_ino), os.fspath(i))
    return ids


def _same_input(st: os.stat_result, inputs: Iterable | dict) -> str | None:
    ids = inputs if isinstance(inputs, dict) else input_ids(inputs)
    return ids.get((st.st_dev, st.st_ino))


def plan(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), label: str | None = None) -> Target:
    """How `path` will be written; UsageError (one line starting with `label`, default the path)
    for a path that must not be written: a folder, a block device, a socket, one of `inputs`, a
    missing or unwritable folder."""
    p = os.fspath(path)
    label = label or p
    if not p:
        raise _refuse(label, "empty output path")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        if exc.errno in _PATH_ERRORS:
            raise _refuse(label, f"cannot be used as an output ({exc.strerror})") from None
        raise
    if st is not None:
        same = _same_input(st, inputs)
        if same is not None:
            raise _refuse(label, f"is an input of this command ({same}); give another output path")
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            raise _refuse(label, "is a folder; give a file name")
        if stat.S_ISBLK(mode) or stat.S_ISSOCK(mode):
            raise _refuse(label, f"is a {'block device' if stat.S_ISBLK(mode) else 'socket'}; give a file name")
        proc, fd = _via_proc(p)
        if not stat.S_ISREG(mode) or proc:
            return Target(p, THROUGH, p, st, fd)
    real = os.path.realpath(p)   # a link (even a dangling one) is followed: its target is written
    parent = os.path.dirname(real) or "."
    if not os.path.isdir(parent):
        raise _refuse(label, f"folder {os.path.dirname(os.path.abspath(p))} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        if st is not None and os.access(real, os.W_OK):
            return Target(p, IN_PLACE, real, st)   # a writable file in a folder we cannot write
        raise _refuse(label, f"folder {parent} is not writable")
    return Target(p, REPLACE, real, st)


def check(path: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), label: str | None = None) -> None:
    """Refuse an output path before any work (see `plan`)."""
    plan(path, inputs, label)


def _umask_mode() -> int:
    """0666 minus the process umask, read from /proc (setting the umask to read it would leave it 0
    for a moment, for every thread); os.umask's set-and-restore where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass   # no /proc (another OS) or an unreadable line: the fallback below
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _write_fd(fd: int, data: bytes, name: str) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, name) from None


TEMP_SUFFIX = ".tmp"
_TEMP_RANDOM = 8   # the characters tempfile.mkstemp puts between prefix and suffix


def temp_prefix(folder: str, base: str, tag: str = "") -> str:
    """The prefix of the temporary file that replaces `base` in `folder`: ".BASE.TAG." (".BASE."
    without a tag), BASE cut by whole characters so that the temporary name fits the folder's
    NAME_MAX in bytes (255 on most filesystems): an output named with 250-255 bytes gets one too."""
    try:
        name_max = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    tail = f".{tag}." if tag else "."
    room = name_max - len(os.fsencode("." + tail)) - _TEMP_RANDOM - len(TEMP_SUFFIX)
    while base and len(os.fsencode(base)) > room:
        base = base[:-1]
    return f".{base}{tail}"


class _Staged:
    """One output on its way: for REPLACE the whole text is in a synced temporary file."""

    def __init__(self, target: Target, data: bytes | Iterator[bytes], exclusive: bool, sync: bool = True,
                 tag: str = ""):
        if not isinstance(data, bytes) and target.kind != REPLACE:
            data = b"".join(data)   # written at commit time: the whole text is needed then
        self.target, self.data, self.exclusive = target, data, exclusive
        self.sync = sync   # False: the caller syncs the temporary file (with others) before commit
        self.tag = tag   # in the temporary file's name (see discard_tagged)
        self.tmp: str | None = None
        if exclusive and target.st is not None:
            raise FileExistsError(errno.EEXIST, "exists; not overwriting", target.path)
        if target.kind == REPLACE:
            self._stage()
            if self.target.kind == REPLACE:   # (staging may turn it into an in-place rewrite, which needs the data)
                self.data = b""   # in the synced temporary file now: many outputs need not all stay in memory

    def _stage(self) -> None:
        t = self.target
        folder = os.path.dirname(t.real) or "."
        fd, self.tmp = tempfile.mkstemp(prefix=temp_prefix(folder, os.path.basename(t.real), self.tag),
                                        suffix=TEMP_SUFFIX, dir=folder)
        try:
            self._fill(fd)
        except BaseException:
            self.discard()   # the temporary file goes with the error: nothing half-written stays
            raise

    def _fill(self, fd: int) -> None:
        """Write, sync and give the temporary file the mode and owner of the file it replaces; closes `fd`."""
        t = self.target
        try:
            if isinstance(self.data, bytes):
                _write_fd(fd, self.data, t.path)
            else:   # chunks, written as they are made: the whole text is never in memory
                for chunk in self.data:
                    _write_fd(fd, chunk, t.path)
                self.data = None
            if self.sync:
                os.fsync(fd)
            if t.st is None:
                os.fchmod(fd, _umask_mode())
                return
            mine = os.fstat(fd)
            if (mine.st_uid, mine.st_gid) != (t.st.st_uid, t.st.st_gid):
                try:
                    os.fchown(fd, t.st.st_uid, t.st.st_gid)
                except PermissionError:   # not ours to give away: keep the owner by rewriting in place
                    if self.data is None:   # written in chunks: the text is in the temporary file
                        self.data = _read_back(fd, t.path)
                    self.target = Target(t.path, IN_PLACE, t.real, t.st)
                    os.close(fd)
                    fd = -1
                    self.discard()
                    return
            os.fchmod(fd, stat.S_IMODE(t.st.st_mode))   # after fchown, which may clear set-id bits
        finally:
            if fd >= 0:
                os.close(fd)

    def commit(self) -> None:
        t = self.target
        if t.kind == REPLACE:
            if self.exclusive:
                os.link(self.tmp, t.real)   # fails if the name appeared meanwhile
                os.unlink(self.tmp)
            else:
                os.replace(self.tmp, t.real)
            self.tmp = None
        elif t.fd is not None:   # /dev/stdout and the like: after what Python has buffered for it
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
            _write_fd(t.fd, self.data, t.path)
        else:   # THROUGH or IN_PLACE: open what is there (never create, never rename)
            fd = os.open(t.real, os.O_WRONLY | os.O_TRUNC | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
            try:
                _write_fd(fd, self.data, t.path)
                if t.kind == IN_PLACE:
                    os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self) -> None:
        if self.tmp is not None:
            try:
                os.unlink(self.tmp)
            except FileNotFoundError:
                pass
            self.tmp = None


def _read_back(fd: int, name: str) -> bytes:
    """The whole content of the open file ``fd``, from its start."""
    os.lseek(fd, 0, os.SEEK_SET)
    parts = []
    try:
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(parts)
            parts.append(b)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, name) from None


def _bytes(data: str | bytes | Iterable[str | bytes]) -> bytes | Iterator[bytes]:
    """Text as UTF-8 bytes; an iterable of text pieces as an iterator of their bytes."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    return (c.encode("utf-8") if isinstance(c, str) else bytes(c) for c in data)


BATCH_SYNC_MIN = 8   # replaced files from which one filesystem sync beats a sync per file


def _syncfs_call():
    """libc's syncfs(fd) (Linux), or None where it cannot be had."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _sync_staged(staged: list[_Staged]) -> None:
    """Put every staged temporary file's data on disk before any is renamed into place.

    Many files: one ``syncfs`` per filesystem holding them (Linux) instead of an ``fsync`` per
    file, which costs a disk flush each. syncfs also flushes other processes' pending writes on
    that filesystem (more data, one flush), and before Linux 5.8 it did not report write-back
    errors; where it is not available or fails, each file is fsynced as for a single output."""
    tmps = [s.tmp for s in staged if s.tmp is not None and not s.sync]
    if not tmps:
        return
    if len(tmps) >= BATCH_SYNC_MIN:
        fn = _syncfs_call()
        if fn is not None:
            folders = {}
            for t in tmps:
                folders.setdefault(os.stat(t).st_dev, os.path.dirname(t) or ".")
            done = True
            for folder in folders.values():
                fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
                try:
                    done = done and fn(fd) == 0
                finally:
                    os.close(fd)
            if done:
                return
    for t in tmps:
        fd = os.open(t, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def stage(target: Target, data: str | bytes, tag: str = "") -> _Staged:
    """One output, as `plan` gave it, staged now: when it is replaced, its temporary file is written
    (not synced), possibly in another process, to be passed later as that output's data to
    `write_all`, which syncs and commits it with the rest; until then `discard()` undoes it. `tag`
    goes in the temporary file's name, so that `discard_tagged` finds what a process that died
    left behind."""
    return _Staged(target, _bytes(data), exclusive=False, sync=False, tag=tag)


def discard_tagged(folder: str, tag: str) -> None:
    """Remove the temporary files `stage(..., tag=tag)` left in `folder` (none once committed)."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(".") and f".{tag}." in name and name.endswith(TEMP_SUFFIX):
            try:
                os.unlink(os.path.join(folder, name))
            except FileNotFoundError:
                pass


def write_all(items: Iterable[tuple[str | os.PathLike, str | bytes | Iterable[str | bytes] | _Staged]],
              inputs: Iterable = (), *, labels: Iterable[str | None] | None = None,
              exclusive: bool = False) -> list[Path]:
    """Write several outputs as one: each path is checked and its file staged in turn (``items``
    may be a generator, and an output's data an iterable of text pieces: then only one piece need
    be in memory, or what `stage` made of it already), the staged files are synced together, then
    all are put in place; an error before that leaves every path as it was."""
    ids = input_ids(inputs)
    labels = iter(labels) if labels is not None else None
    staged: list[_Staged] = []
    paths: list[Path] = []
    try:
        for p, data in items:
            label = next(labels, None) if labels is not None else None
            if isinstance(data, _Staged):
                staged.append(data)
                if exclusive or data.target.path != os.fspath(p):   # a caller's mistake, not the user's
                    raise ValueError(f"{p}: staged for {data.target.path}, exclusive={exclusive}")
            else:
                staged.append(_Staged(plan(p, ids, label), _bytes(data), exclusive, sync=False))
            paths.append(Path(p))
        _sync_staged(staged)
        for s in staged:
            s.commit()
    finally:
        for s in staged:
            s.discard()
    return paths


def write(path: str | os.PathLike, data: str | bytes, inputs: Iterable = (), *, label: str | None = None,
          exclusive: bool = False) -> Path:
    """Write one output by the rules above; `exclusive`: refuse (FileExistsError) an existing path."""
    return write_all([(path, data)], inputs, labels=[label], exclusive=exclusive)[0]
