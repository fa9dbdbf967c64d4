"""Numeric fields of /proc and /sys counter files (pure), and reading such a file in one call.

Counters and sizes there are non-negative decimal integers. A field with a sign, a fraction or
anything else is malformed: the parsers skip the row (or the field) it is in and say so, the
source counts it as a read error (`otelgpu.agent.source.errors`) and lists it under `unreadable`
in `otel-gpu doctor`; such a value is never exported.

Checks are `str.isdigit` on ASCII text, not a regular expression: the sources check a few hundred
fields a round, and a `fullmatch` per field was a third of a /proc parser's time.
"""
from __future__ import annotations

import errno
import os

READ_SIZE = 16384   # bytes a read: these files are a few KB (a larger buffer costs more to allocate)
MAX_READ = 8 << 20  # bytes of one file at most (/proc/net/dev of thousands of interfaces is ~1 MB)


def counter(text: str) -> int:
    """`text` (surrounding whitespace allowed) as a non-negative integer; ValueError otherwise."""
    stripped = text.strip()
    if not (stripped.isascii() and stripped.isdigit()):   # ASCII: isdigit is then 0-9 only
        raise ValueError(f"{stripped[:40]!r} is not a non-negative integer")
    return int(stripped)


def counters(fields: list[str]) -> list[int]:
    """Whitespace-free fields (from `str.split()`) as non-negative integers, checked all at once;
    ValueError naming the first malformed one otherwise."""
    joined = "".join(fields)
    if joined.isascii() and joined.isdigit() and all(fields):
        return [int(f) for f in fields]
    return [counter(f) for f in fields]   # raises on the first malformed field


def read_text(path: str) -> str:
    """The whole of a small /proc or /sys file, read with `os.read` (no buffered text layer);
    bytes that are not UTF-8 are kept as surrogate escapes. OSError as `open` raises it, and for
    what a /proc or /sys file never is: a FIFO opens without waiting for a writer (and reads as
    empty, or fails with EAGAIN when its writer has written nothing), a file of more than MAX_READ
    bytes (a link to /dev/zero) fails with EFBIG."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        data = os.read(fd, READ_SIZE)
        if data:   # to the end of the file: a read may stop short of it
            chunks, size = [data], len(data)
            while chunk := os.read(fd, READ_SIZE):
                chunks.append(chunk)
                size += len(chunk)
                if size > MAX_READ:
                    raise OSError(errno.EFBIG, f"larger than {MAX_READ >> 20} MiB", path)
            if len(chunks) > 1:
                data = b"".join(chunks)
    finally:
        os.close(fd)
    return data.decode("utf-8", "surrogateescape")
