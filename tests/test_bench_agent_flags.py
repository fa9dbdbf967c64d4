"""bench/bench_agent.py's GPU-source flags: a count the stand-in cannot give, --stub-gpus with
--real-gpus, or --beside-fake without --stub-gpus is one line on stderr and exit 2, before any
server or agent starts."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_agent.py"


def run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *flags], capture_output=True, text=True, timeout=60)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.integers(max_value=0), st.integers(min_value=65)),
       st.booleans())
def test_a_count_outside_the_stand_ins_range_is_refused(count, beside):
    got = run("--stub-gpus", str(count), *(["--beside-fake"] if beside else []))
    assert got.returncode == 2
    assert got.stderr.strip() == "--stub-gpus: a count of GPUs from 1 to 64 (the stand-in's most), without --real-gpus"


def test_stub_and_real_gpus_together_are_refused():
    got = run("--stub-gpus", "2", "--real-gpus")
    assert got.returncode == 2 and got.stderr.strip().startswith("--stub-gpus:") and "\n" not in got.stderr.strip()


def test_beside_fake_needs_stub_gpus():
    got = run("--beside-fake", "--duration", "1")
    assert got.returncode == 2
    assert got.stderr.strip() == "--beside-fake: only with --stub-gpus N (an agent on N fake GPUs beside the stand-in's)"
