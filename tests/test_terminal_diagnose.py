"""`otel-gpu diagnose` and `otel-gpu run`'s summary fit the terminal they print on: a real recording
diagnosed at 80 and 120 columns, every line within the width, continuation lines hanging under their
label; a pipe gets one line per item (for grep); counts in the singular where there is one."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from otel_gpu.diagnose import report as rp
from otel_gpu.diagnose.findings import Finding
from otel_gpu.terminal import wrap_lines
from otel_gpu.words import all_of, count, noun, plural_of
from tests.childenv import REPO, clean_env

LABEL = re.compile(r"^(\d+\. |   (seen|why|do|where|when):\s+|  (note|work|time): |otel-gpu diagnose: )")


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A real one-rank recording of a plain PyTorch loop (no agent: no GPU, no node series)."""
    d = tmp_path_factory.mktemp("rec") / "run"
    p = subprocess.run([sys.executable, "-m", "otel_gpu", "run", "--record", str(d), "--no-agent", "--",
                        sys.executable, str(REPO / "tests/training/untouched_loop.py"), "30", "0"],
                       env=clean_env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return d, p.stderr


def diagnose(directory, columns: str | None) -> list[str]:
    env = clean_env()
    env.pop("COLUMNS", None)
    if columns:
        env["COLUMNS"] = columns
    p = subprocess.run([sys.executable, "-m", "otel_gpu", "diagnose", str(directory)], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("width", [80, 120])
def test_diagnose_of_a_recording_fits_the_terminal(recording, width):
    lines = diagnose(recording[0], str(width))
    assert all(len(line) <= width for line in lines), "\n".join(x for x in lines if len(x) > width)
    text = " ".join(" ".join(lines).split())
    assert "1 rank, 0 GPUs, 0 nodes" in text and "rank(s)" not in text
    findings = [i for i, line in enumerate(lines) if re.match(r"\d+\. \[", line)]
    assert findings
    for line in lines:   # a wrapped line hangs under its label's text: never back at column 0
        assert not line or LABEL.match(line) or line.startswith("   "), line


@pytest.mark.slow
def test_diagnose_into_a_pipe_keeps_one_line_per_item(recording):
    lines = diagnose(recording[0], None)
    assert lines[0].startswith("otel-gpu diagnose: job untouched_loop") and lines[0].endswith(" s")
    assert all(not line or LABEL.match(line) for line in lines)


@pytest.mark.slow
def test_the_run_summary_names_the_report_by_its_absolute_path(recording):
    d, err = recording
    last = err.strip().splitlines()[-1]
    assert last == f"otel-gpu: report {d / 'report.html'}" and os.path.isabs(last.split(" ", 2)[2])
    assert "rank 0: 29 steps" in err
    p = subprocess.run([sys.executable, "-m", "otel_gpu", "report", str(d), "-o", "../x.html"], env=clean_env(),
                       cwd=d, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == f"otel-gpu: report {d.parent / 'x.html'}"


words = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)
prose = st.lists(words, min_size=1, max_size=60).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(width=st.integers(40, 200), title=prose, seen=prose, why=prose, action=prose, note=prose,
       ranks=st.lists(st.integers(0, 999).map(str), max_size=12), missing=st.booleans())
def test_diagnosis_text_fits_any_width(width, title, seen, why, action, note, ranks, missing):
    f = Finding(rule="r", title=title, severity="warning", confidence="high", seen=seen, why=why, action=action,
                lost_s=12.5, lost_share=0.1, where={"ranks": ranks} if ranks else {},
                missing=["x"] if missing else [])
    d = {"job": "j", "start": 1.7e9, "end": 1.7e9 + 60, "duration_s": 60.0, "ranks": len(ranks), "gpus": 1, "nodes": 1,
         "notes": [note], "findings": [f.as_dict()], "queries": {"queries": 3, "query_seconds": 0.1}}
    lines = rp.text(d, width).splitlines()
    assert all(len(line) <= width for line in lines)
    assert "".join(rp.text(d, None).split()) == "".join(" ".join(lines).split())   # the same text
    if ranks:
        assert ("where: rank " in rp.text(d, None)) is (len(set(ranks)) == 1)


@settings(max_examples=60, deadline=None)
@given(width=st.integers(40, 200), lines=st.lists(st.tuples(st.sampled_from(["", "  ", "  1. [critical] ", "  rank 0: "]),
                                                         prose), max_size=6))
def test_summary_lines_wrap_but_keep_a_path_whole(width, lines):
    path = "/home/someone/otel-gpu/otel-gpu-runs/tiny_train-20261123T183509Z/report.html"
    text = "\n".join(lead + body for lead, body in lines) + f"\notel-gpu: report {path}"
    out = wrap_lines(text, width).splitlines()
    at = next(line for line in out if path in line)   # whole on one line: beside its label, or alone when too long
    assert at in (path, f"otel-gpu: report {path}") and (at == path) is (len(f"otel-gpu: report {path}") > width)
    assert all(len(line) <= width for line in out if path not in line and max(map(len, line.split()), default=0) < width // 2)


@given(n=st.integers(0, 10**7))
def test_counts_take_the_singular_for_one_only(n):
    s = count(n, "rank")
    assert s == (f"{n:,} rank" if n == 1 else f"{n:,} ranks")
    assert count(n, "process").endswith("process" if n == 1 else "processes")
    assert count(float(n), "step") == count(n, "step") and count(1.5, "step") == "1.5 steps"


@given(n=st.integers(0, 10**4),
       word=st.sampled_from(["rank", "GPU", "pass", "query", "day", "process", "box", "patch"]))
def test_nouns_agree_with_their_count(n, word):
    many = {"rank": "ranks", "GPU": "GPUs", "pass": "passes", "query": "queries", "day": "days",
            "process": "processes", "box": "boxes", "patch": "patches"}[word]
    assert plural_of(word) == many and noun(n, word) == (word if n == 1 else many)
    assert count(n, word).split(" ", 1)[1] == noun(n, word)
    assert all_of(n, word) == (f"the only {word}" if n == 1 else f"all {n:,} {many}")
