"""Every OTELGPU_* value the ranks read is checked before `otel-gpu run` starts anything: a bad one is
exit 2 with one line naming the variable, and the command never runs; an unknown name is a warning."""
from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.errors import ConfigError
from otel_gpu.profiling import profile_settings
from otel_gpu.settings_check import KNOWN, RANK_VARIABLES, check_rank_settings, unknown_settings
from tests.childenv import clean_env

INTS = {"OTELGPU_PROFILE_UPLOAD_S": (1, 3600), "OTELGPU_PROFILE_RATE": (1, 1000)}
CHOICES = {"OTELGPU_PROFILE_MODE": ("wall", "cpu"), "OTELGPU_PROFILE_THREADS": ("all", "gil"),
           "OTELGPU_FLOPS": ("formula", "measure")}
SWITCHES = ("OTELGPU_TRAINING", "OTELGPU_PROFILE")
SWITCH_WORDS = ("1", "0", "true", "false", "yes", "no", "on", "off")


def _int_in(text: str, lo: int, hi: int) -> bool:
    try:
        return lo <= int(text.strip()) <= hi
    except ValueError:
        return False


@given(name=st.sampled_from(sorted(INTS)), raw=st.text(min_size=1) | st.sampled_from(["abc", "-5", "1e400", "0",
                                                                                     "nan", "inf", "2.5", "3601"]))
def test_a_bad_number_names_the_variable(name, raw):
    lo, hi = INTS[name]
    if not raw.strip() or _int_in(raw, lo, hi):
        check_rank_settings({name: raw})
        return
    with pytest.raises(ConfigError) as err:
        check_rank_settings({name: raw})
    assert str(err.value).startswith(f"{name}={raw!r}: ")
    assert "\n" not in str(err.value)


@given(name=st.sampled_from(sorted(INTS)), data=st.data())
def test_every_number_in_range_is_taken(name, data):
    lo, hi = INTS[name]
    value = data.draw(st.integers(lo, hi))
    check_rank_settings({name: f" {value} "})
    env = {"OTELGPU_PYROSCOPE_URL": "http://127.0.0.1:4040", name: str(value)}
    s = profile_settings(env, "app", {})
    assert (s.upload_interval_s if name.endswith("UPLOAD_S") else s.sample_rate) == value


@given(name=st.sampled_from(sorted(CHOICES) + list(SWITCHES)), raw=st.text(min_size=1))
def test_choices_and_switches(name, raw):
    allowed = CHOICES.get(name, SWITCH_WORDS)
    text = raw.strip() if name in CHOICES else raw.strip().lower()
    if not raw.strip() or text in allowed:
        check_rank_settings({name: raw})
        return
    with pytest.raises(ConfigError) as err:
        check_rank_settings({name: raw})
    assert str(err.value).startswith(f"{name}={raw!r}: expected ")


@given(raw=st.text(min_size=1))
def test_job_and_pyroscope_url(raw):
    for name in ("OTELGPU_JOB", "OTELGPU_PYROSCOPE_URL"):
        try:
            check_rank_settings({name: raw})
        except ConfigError as exc:
            assert str(exc).startswith(name)
        else:
            assert not raw.strip() or (name == "OTELGPU_JOB" and raw.strip().isprintable()) or \
                raw.strip().lower().startswith(("http://", "https://"))


@given(suffix=st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=20))
def test_unknown_names_warn_known_ones_do_not(suffix):
    name = "OTELGPU_" + suffix
    lines = unknown_settings({name: "1", "PATH": "/bin"})
    assert lines == ([] if name in KNOWN else [lines[0]])
    if name not in KNOWN:
        assert lines[0].startswith(f"{name} is not an otel-gpu setting")


def test_every_rank_variable_is_known_and_documented():
    from pathlib import Path
    docs = "".join(p.read_text() for p in (Path(__file__).parents[1] / "docs").glob("*.md"))
    for name in RANK_VARIABLES:
        assert name in KNOWN and name in docs, name


def _run(tmp_path, env, marker):
    cmd = [sys.executable, "-m", "otel_gpu", "run", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path, env=clean_env(**env))


@pytest.mark.parametrize("value, expected", [("abc", "expected an integer"), ("-5", "must be between 1 and 3600"),
                                             ("1e400", "expected an integer")])
def test_run_refuses_a_bad_value_before_anything_starts(tmp_path, value, expected):
    marker = tmp_path / "command-ran"
    proc = _run(tmp_path, {"OTELGPU_PROFILE_UPLOAD_S": value}, marker)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"otel-gpu run: OTELGPU_PROFILE_UPLOAD_S={value!r}: {expected}"
    assert not marker.exists()                          # the command never started
    assert not (tmp_path / "otel-gpu-runs").exists()     # nor the recording


@settings(max_examples=3, deadline=None)
@given(name=st.sampled_from(["OTELGPU_PROFILE_RATE", "OTELGPU_TRAINING", "OTELGPU_PROFILE_MODE"]),
       value=st.sampled_from(["abc", "-1", "1e400", "maybe"]))
def test_run_refuses_other_rank_settings(tmp_path_factory, name, value):
    tmp_path = tmp_path_factory.mktemp("run")
    marker = tmp_path / "command-ran"
    proc = _run(tmp_path, {name: value, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, marker)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith(f"otel-gpu run: {name}={value!r}: ")
    assert not marker.exists()


def test_an_unknown_setting_is_a_warning(tmp_path):
    marker = tmp_path / "command-ran"
    proc = _run(tmp_path, {"OTELGPU_PROFILE_UPLOADS": "5", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, marker)
    assert proc.returncode == 0, proc.stderr
    assert ("otel-gpu run: warning: OTELGPU_PROFILE_UPLOADS is not an otel-gpu setting and is ignored "
            "(did you mean OTELGPU_PROFILE_UPLOAD_S?)") in proc.stderr.splitlines()
    assert marker.exists()


def test_every_variable_the_package_reads_by_name_is_known_and_documented():
    """An OTELGPU_* name read straight from the environment anywhere in the package is a known
    setting (no "not an otel-gpu setting" warning for it) and documented (docs/ or the README)."""
    import re
    from pathlib import Path
    root = Path(__file__).parents[1]
    docs = "".join(p.read_text() for p in [root / "README.md", *(root / "docs").glob("*.md")])
    read = re.compile(r'(?:environ\.get\(|environ\[|getenv\()\s*"(OTELGPU_[A-Z0-9_]+)"')
    names = {m for p in (root / "otel_gpu").rglob("*.py") for m in read.findall(p.read_text())}
    assert "OTELGPU_TRACE_GZIP" in names
    for name in sorted(names):
        assert name in KNOWN and name in docs, name
