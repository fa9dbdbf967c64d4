"""Reading a small file we did not write: at most `max_bytes`, never waiting without end.

A path given by a user may be a regular file, a pipe from the shell (`<(cat f)`, `/dev/stdin`), a
named FIFO, a character device (`/dev/zero`) or a directory. `read_bytes` opens it without blocking
(a FIFO with no writer opens at once, and is an error: nothing to read), reads at most `max_bytes` (one more is
an error naming the bound) and waits for a pipe's data at most `timeout_s` seconds in all. Every
failure is an OSError whose `strerror` is one line ("larger than 1 MiB", "nothing to read within
10 s", "Is a directory").
"""
from __future__ import annotations

import errno
import os
import select
import stat
import time

from .inflate import mib

CHUNK = 65536


def read_bytes(path: str | os.PathLike, max_bytes: int, timeout_s: float = 10.0) -> bytes:
    """The whole content of `path`, at most `max_bytes`; OSError (one line) otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        deadline = time.monotonic() + timeout_s
        chunks, size = [], 0
        while size <= max_bytes:
            try:
                chunk = os.read(fd, min(CHUNK, max_bytes + 1 - size))
            except BlockingIOError:   # a pipe whose writer has not written yet
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([fd], [], [], left)[0]:
                    raise OSError(errno.ETIMEDOUT, f"nothing to read within {timeout_s:g} s", str(path)) from None
                continue
            if not chunk:
                if not size and stat.S_ISFIFO(mode):
                    raise OSError(errno.ENODATA, "a pipe with nothing to read (no writer)", str(path))
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if not stat.S_ISREG(mode) and time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, f"still reading after {timeout_s:g} s", str(path))
        raise OSError(errno.EFBIG, f"larger than {mib(max_bytes)}", str(path))
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, max_bytes: int, timeout_s: float = 10.0) -> str:
    """`read_bytes` as UTF-8 text; UnicodeDecodeError when it is not."""
    return read_bytes(path, max_bytes, timeout_s).decode("utf-8")
