"""An output whose name is as long as the filesystem allows (250-255 bytes, valid) is written: the
temporary file beside it takes a cut name that fits NAME_MAX, for any name (Hypothesis), and the
tag that finds a dead writer's leftovers stays in it."""
from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu import output
from otel_gpu.cli import main
from tests.record.synth import write_node

NAME_CHARS = st.characters(min_codepoint=1, max_codepoint=0x10FFFF, exclude_categories=("Cs",),
                           exclude_characters="/")


def _name(chars: str, size: int) -> str:
    """`chars` repeated and padded with "a" to exactly `size` bytes (UTF-8), then ".out"."""
    body = ""
    for ch in (chars or "a") * size:
        if len((body + ch).encode()) > size - 4:
            break
        body += ch
    return body + "a" * (size - 4 - len(body.encode())) + ".out"


@settings(max_examples=200)
@given(st.text(NAME_CHARS, min_size=1, max_size=300), st.sampled_from(["", "t1", "run-42"]))
def test_the_temporary_name_fits_name_max_and_keeps_what_finds_it(base, tag):
    prefix = output.temp_prefix("/tmp", base, tag)
    longest = os.fsencode(prefix) + b"x" * 8 + output.TEMP_SUFFIX.encode()
    assert len(longest) <= os.pathconf("/tmp", "PC_NAME_MAX")
    kept = prefix[1:len(prefix) - len(f".{tag}." if tag else ".")]
    assert base.startswith(kept) and prefix.endswith(f".{tag}." if tag else ".")
    if len(os.fsencode(base)) <= 200:
        assert kept == base   # a name of ordinary length is not cut


@pytest.mark.parametrize("size", [250, 253, 255])
@pytest.mark.parametrize("chars", ["a", "é€", "日本"])
def test_names_of_250_to_255_bytes_are_written_and_replaced(tmp_path, size, chars):
    path = tmp_path / _name(chars, size)
    assert len(path.name.encode()) == size
    output.write(path, "one")
    output.write(path, "two")   # replaced through a temporary file beside it
    assert path.read_text() == "two" and os.listdir(tmp_path) == [path.name]


def test_a_report_named_with_255_bytes(tmp_path, capsys):
    write_node(tmp_path / "run", "h", [0], 0, time.time() - 100, 6)
    out = tmp_path / _name("r", 255)
    assert main(["report", str(tmp_path / "run"), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
