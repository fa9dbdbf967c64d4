"""Decompression with a bound on what comes out: gzip and deflate bodies we did not write.

`gzip.decompress` and `zlib.decompress` build the whole output before anyone can look at its size,
so a 1 MB body of zeros costs 1 GB. Here the output is produced at most `limit` bytes at a time
(zlib's `max_length`) and `TooLarge` is raised as soon as it would pass `limit`: memory stays
within `limit` plus one chunk, whatever the input.
"""
from __future__ import annotations

import zlib

GZIP, DEFLATE = "gzip", "deflate"
_WBITS = {GZIP: 16 + zlib.MAX_WBITS, DEFLATE: zlib.MAX_WBITS}


class TooLarge(ValueError):
    """The output would pass its bound; `limit` is that bound in bytes."""

    def __init__(self, what: str, limit: int):
        super().__init__(f"{what} inflates to more than {mib(limit)}")
        self.limit = limit


class Inflater:
    """An incremental gzip or deflate decoder whose total output is bounded (`feed` chunks of the
    compressed stream, then `finish`). zlib.error or EOFError for a stream that is not one."""

    def __init__(self, encoding: str, limit: int, what: str = "the body"):
        self.encoding, self.limit, self.what = encoding, max(0, limit), what
        self.produced = 0
        self._d = zlib.decompressobj(_WBITS[encoding])

    def feed(self, data: bytes) -> bytes:
        out = []
        while True:
            if self._d.eof:   # gzip allows several members one after the other (and zero padding)
                rest = self._d.unused_data + data
                if self.encoding != GZIP or not rest.strip(b"\0"):
                    break
                self._d, data = zlib.decompressobj(_WBITS[GZIP]), rest
            if not data:
                break
            chunk = self._d.decompress(data, self.limit + 1 - self.produced)   # max_length >= 1
            self.produced += len(chunk)
            if self.produced > self.limit:
                raise TooLarge(self.what, self.limit)
            out.append(chunk)
            data = self._d.unconsumed_tail
        return b"".join(out)

    def finish(self) -> bytes:
        """The rest of the output; EOFError when the stream ended before its end marker."""
        if not self._d.eof:
            raise EOFError("compressed data ended before the end-of-stream marker")
        return b""


def inflate(data: bytes, encoding: str, limit: int, what: str = "the body") -> bytes:
    """`data` gzip- or deflate-decoded (`encoding`), at most `limit` bytes of output; TooLarge
    past it; zlib.error or EOFError when `data` is not such a stream."""
    d = Inflater(encoding, limit, what)
    out = d.feed(data)
    d.finish()
    return out


def mib(n: int) -> str:
    """A byte count for a message: '16 MiB', '512 KiB', '100 bytes'."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} bytes"
