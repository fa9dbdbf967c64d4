"""`otel-gpu doctor` prints tables, not Python dicts."""
import re
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings, strategies as st
from rich.console import Console

from otel_gpu.agent.doctor_view import cell, doctor_view, human

REPO = Path(__file__).resolve().parents[2]
JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(alphabet="abc xyz_", max_size=10),
                       lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(alphabet="abc", max_size=6), inner, max_size=4),
                       max_leaves=12)


def render(report, width=80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(doctor_view(report))
    return console.export_text()


@settings(max_examples=80, deadline=None)
@given(value=JSONISH)
def test_a_cell_is_never_a_python_repr(value):
    text = cell(value)
    if not isinstance(value, str):
        assert "{'" not in text and "['" not in text and "None" not in text
    assert text


def test_records_scalars_and_unreadable_paths_are_laid_out():
    report = {"notes": ["NVIDIA driver not found"], "sources": {
        "net": {"source": "net", "counters_from": "/proc/net/dev", "exclude": ["lo"],
                "interfaces": [{"name": "eth0", "speed_bps": 1e10, "limit_bytes_per_s": 1.25e9}],
                "memory_total": 25276510208,
                "unreadable": ["/sys/class/net/ib0/speed: Invalid argument"]},
        "nvml": {"source": "nvml", "gpus": [{"index": i, "uuid": f"GPU-{i}", "name": "H100", "status": "ok", "gpm": "supported",
                                             "nvlink": True, "mig_mode": "disabled", "supported": ["a"] * 9, "errors": {}}
                                            for i in range(2)]}}}
    text = render(report)
    assert "{'" not in text and "['" not in text
    assert "NVIDIA driver not found" in text
    assert "eth0" in text and "10 Gbit/s" in text and "1.25 GB/s" in text
    assert "net: unreadable" in text and "/sys/class/net/ib0/speed: Invalid argument" in text
    assert "nvml: gpus 0" in text and "nvml: gpus 1" in text and "errors" not in text   # empty everywhere: left out
    assert all(len(line) <= 80 for line in text.splitlines())


def test_doctor_command_prints_tables():
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "doctor", "--fake-gpus", "2"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert "nvml: gpus 0" in out.stdout and "GPU-00000000" in out.stdout
    assert "{'" not in out.stdout and "': " not in out.stdout


def test_sizes_and_rates_show_in_human_units():
    assert cell(25276510208, key="memory_total") == "23.5 GiB"
    assert cell(0, key="swap_total") == "0 B"
    assert cell(1e10, key="speed_bps") == "10 Gbit/s"
    assert cell(2048, key="used_bytes") == "2 KiB"
    assert cell(25276510208, key="count") == "25276510208"     # not a size: left exact
    assert human(999, "B", 1024) == "999 B"


@settings(max_examples=40, deadline=None)
@given(value=st.floats(min_value=0, max_value=1e20) | st.integers(min_value=0, max_value=2**70))
def test_human_units_stay_short(value):
    text = human(value, "B", 1024)
    number, unit = text.split(" ")
    assert float(number) < 1024 or unit == "PiB"
    assert len(text) <= 12 or unit == "PiB"


def _doctor(width: int) -> str:
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "doctor", "--fake-gpus", "2"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin",
                                                      "COLUMNS": str(width), "TERM": "dumb"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_doctor_fits_80_and_120_columns_with_whole_titles():
    for width in (80, 120):
        text = _doctor(width)
        lines = text.splitlines()
        assert all(len(line) <= width for line in lines), max(lines, key=len)
        for title in ("nvml", "nvml: gpus 0", "nvml: gpus 1", "nvml: field_costs", "host", "net", "disk"):
            assert title in lines, (width, title)   # a title is one whole line, never wrapped
        host = text[text.index("\nhost\n"):text.index("\nnet\n")]
        assert "iB" in host and not re.search(r"\d{7,}", host)   # memory in human units, not raw bytes
        costs = text[text.index("nvml: field_costs"):]
        assert "energy" in costs and "background" in costs and "GPM" in costs


def test_doctor_help_describes_it_and_shows_fake_gpus():
    out = subprocess.run([sys.executable, "-m", "otel_gpu", "doctor", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "80"})
    assert out.returncode == 0 and "--fake-gpus N" in out.stdout and "what each NVML field costs" in out.stdout
