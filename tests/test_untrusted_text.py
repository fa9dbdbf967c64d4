"""Names from data reach no terminal, page or Markdown file raw: a recording, a trace, a /proc tree,
a trial's reason and the environment each carry escape sequences (window title, clear screen,
colour), newlines, bidi overrides, rich markup and HTML; every command that shows them shows them
escaped (`\\x1b`), obeys none, and the report's data still loads."""
from __future__ import annotations

import html
import json
import re
import sys
import time
from io import StringIO

import pytest
from rich.console import Console

from otel_gpu.cli import main
from tests.childenv import clean_env
from tests.record.synth import write_node

ESC = "\x1b"
NASTY = "\x1b]0;pwned\x07\x1b[2J\x1b[31m<img src=x onerror=alert(1)><!--</script>\u2028|*x* [bold]B[/bold]\u202e\r\nZ"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31m"   # how the start of NASTY must read on a terminal


def _no_raw_control(text: str) -> None:
    assert ESC not in text and "\x07" not in text and "\r" not in text and "\u202e" not in text and "\u2028" not in text
    assert "\x9b" not in text


@pytest.fixture(scope="module")
def hostile_recording(tmp_path_factory):
    """A recording whose job, host and rank names carry NASTY (two ranks, data-wait bound)."""
    d = tmp_path_factory.mktemp("hostile") / "run"
    d.mkdir()
    write_node(d, "node" + NASTY, [0, 1], 1, time.time() - 100, 20, data_wait_share=0.6, job="job" + NASTY)
    return d


def test_diagnose_text_shows_every_name_escaped(hostile_recording, capsys):
    assert main(["diagnose", str(hostile_recording)]) == 0
    out = capsys.readouterr().out
    _no_raw_control(out)
    assert f"job job{SHOWN}" in out and "[bold]B[/bold]" in out and "\\u202e\\r\\nZ" in out
    assert "1. [CRITICAL] input-bound" in out


def test_diagnose_markdown_has_no_raw_html_and_no_broken_table(hostile_recording, tmp_path, capsys):
    md = tmp_path / "d.md"
    assert main(["diagnose", str(hostile_recording), "--markdown", str(md)]) == 0
    capsys.readouterr()
    text = md.read_text()
    _no_raw_control(text)
    assert "<img" not in text and "<!--" not in text and "</script" not in text
    assert text.startswith(r"# otel-gpu diagnosis: job\\x1b\]0;pwned\\x07") and "&lt;img src=x" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "critical" in line]
    assert rows and all(len(re.findall(r"(?<!\\)\|", r)) == 6 for r in rows), rows   # 5 cells each, none split


def test_report_summary_and_page_data(hostile_recording, tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", str(hostile_recording), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    _no_raw_control(printed)
    assert f"otel-gpu: job job{SHOWN}" in printed
    page = out.read_text()
    script = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1)
    assert "<" not in script and "\u2028" not in script
    data = json.loads(script)
    assert data["job"] == "job" + NASTY and data["findings"]   # the names as they are, for the page to show as text
    body = page.replace(script, "")
    assert "<img" not in body and "<!--" not in body and ESC not in body
    assert html.escape("<img src=x") in body   # the title and summary show the name


def test_a_recording_name_in_an_error_line_is_escaped(tmp_path, capsys):
    assert main(["report", str(tmp_path / f"nowhere{NASTY}")]) == 2
    err = capsys.readouterr().err
    _no_raw_control(err)
    assert len(err.splitlines()) == 1 and "nowhere\\x1b]0;pwned" in err


def test_trace_analyze_and_diff_show_names_escaped_and_obey_no_markup(tmp_path, capsys):
    from tests.trace.kineto import training_trace

    d = tmp_path / "traces"
    d.mkdir()
    b = training_trace(0, short_kernels=True)
    for e in b.events:
        if e.get("cat") in ("kernel", "cpu_op"):
            e["name"] += NASTY
    b.write(str(d / "rank0.json"))
    assert main(["trace", "analyze", str(d)]) == 0
    out = capsys.readouterr().out
    _no_raw_control(out)
    assert "_nn\\x1b]0;pwn" in out   # the kernel's name, shortened in its column
    assert main(["trace", "diff", str(d), str(d)]) == 0
    _no_raw_control(capsys.readouterr().out)


def test_trace_set_name_in_markup_is_shown_as_it_is(tmp_path, capsys):
    from tests.trace.kineto import training_trace

    d = tmp_path / "[red]set\x1b[2J"
    d.mkdir()
    training_trace(0).write(str(d / "rank0.json"))
    assert main(["trace", "analyze", str(d)]) == 0
    out = capsys.readouterr().out
    _no_raw_control(out)
    assert "[red]set\\x1b[2J" in out


def _render(view) -> str:
    buf = StringIO()
    Console(file=buf, width=200, force_terminal=False, color_system=None).print(view)
    return buf.getvalue()


def test_live_view_and_doctor_show_system_names_escaped():
    from otel_gpu import names
    from otel_gpu.agent.doctor_view import doctor_view
    from otel_gpu.agent.liveview import node_view
    from otel_gpu.agent.store import Store
    from otel_gpu.readings import Reading

    store = Store(window_s=10)
    g = {names.HW_ID: "GPU-0", names.HW_NAME: "H100" + NASTY, names.GPU_INDEX: "0"}
    store.put("nvml", [Reading(names.GPU_MEMORY_LIMIT, 8e10, g), Reading(names.GPU_UTILIZATION, 0.5, g)], 0)
    store.put("net", [Reading(names.NET_IO, 1e6, {names.IFACE: "e\x1b[2J[b]x", names.DIRECTION: "receive"})], 0)
    store.put("disk", [Reading(names.DISK_IO, 1e6, {names.DEVICE: "d\x1b]0;t\x07", names.DISK_DIRECTION: "read"})], 0)
    snap = store.snapshot()
    out = _render(node_view(snap, snap, 1.0))
    _no_raw_control(out)
    assert "e\\x1b[2J[b]x" in out and "d\\x1b]0;t\\x07" in out
    out = _render(doctor_view({"notes": ["note" + NASTY], "sources": {"net": {"interfaces": [{"name": "e\x1b[2J[b]x"}],
                                                                                "path": "/sys/[red]x\x1b[2J"}}}))
    _no_raw_control(out)
    assert "[red]x\\x1b[2J" in out and "e\\x1b[2J[b]x" in out and "[bold]B[/bold]" in out


def test_agent_once_shows_an_interface_name_escaped(tmp_path):
    import subprocess

    net = tmp_path / "proc" / "net"
    net.mkdir(parents=True)
    (net / "dev").write_text("Inter-|   Receive |  Transmit\n face |bytes packets|bytes packets\n"
                             "  eth0\x1b]0;pwned\x07\x1b[2J: 100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0\n")
    proc = subprocess.run([sys.executable, "-m", "otel_gpu", "agent", "--once", "--no-gpu", "--proc-root",
                           str(tmp_path / "proc")], capture_output=True, text=True, timeout=60, env=clean_env())
    assert proc.returncode == 0, proc.stderr
    _no_raw_control(proc.stdout + proc.stderr)
    assert "network.interface.name=eth0\\x1b]0;pwned\\x07\\x1b[2J" in proc.stdout


def test_unknown_setting_names_are_shown_escaped():
    from otel_gpu.settings_check import unknown_settings

    (line,) = unknown_settings({"OTELGPU_X\x1b]0;t\x07\x1b[2J": "1"})
    _no_raw_control(line)
    assert line.startswith("OTELGPU_X\\x1b]0;t\\x07\\x1b[2J is not an otel-gpu setting")


def test_tune_table_report_and_progress_show_a_trial_reason_escaped(tmp_path):
    optuna = pytest.importorskip("optuna", reason="optuna not installed (pip install 'otel-gpu[tune]')")
    from otel_gpu.tune import report
    from otel_gpu.tune.cli import Progress

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s" + NASTY)
    study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"status": "failed", "role": "sampled",
                                                                     "reason": "RuntimeError: " + NASTY}))
    out = _render(report.terminal_table(study))
    _no_raw_control(out)
    assert "RuntimeError: \\x1b]0;pwned" in out and "[bold]B[/bold]" in out
    md = report.markdown(study)
    assert "<img" not in md and "&lt;img" in md and ESC not in md

    class Tuner:   # what Progress reads of the tuner
        class s:
            trials = 1
    buf = StringIO()
    Progress(Tuner(), Console(file=buf, force_terminal=False, color_system=None, width=300))("note", "warn " + NASTY)
    _no_raw_control(buf.getvalue())
    assert "warn \\x1b]0;pwned" in buf.getvalue() and "[bold]B[/bold]" in buf.getvalue()


def test_a_lone_surrogate_in_trace_names_is_written_everywhere(tmp_path, capsys):
    """JSON's "\\udc80" in kernel, op, process and thread names: the terminal, --json and --csv all written."""
    from tests.trace.kineto import training_trace

    d = tmp_path / "traces"
    d.mkdir()
    b = training_trace(0, short_kernels=True)
    for e in b.events:
        if e.get("cat") in ("kernel", "cpu_op"):
            e["name"] += "\udc80"
            e["tid"] = "t\udc81" if e["cat"] == "cpu_op" else e["tid"]
        if e.get("ph") == "M":
            e["args"]["name"] += "\ud800"
    b.write(str(d / "rank0.json"))
    assert main(["trace", "analyze", str(d), "--json", str(tmp_path / "a.json"), "--csv", str(tmp_path / "csv")]) == 0
    assert "\\udc80" in capsys.readouterr().out
    assert "\\\\udc80" in (tmp_path / "a.json").read_text()   # the name as it is shown, JSON-escaped
    assert "\\udc80" in (tmp_path / "csv" / "gpu_kernel_breakdown_kernels.csv").read_text()
    assert main(["trace", "diff", str(d), str(d), "--csv", str(tmp_path / "diff")]) == 0


def test_an_ascii_only_stdout_gets_escapes_not_an_error(tmp_path):
    import subprocess

    d = tmp_path / "run"
    d.mkdir()
    write_node(d, "nœud", [0, 1], 0, time.time() - 100, 10, job="entraînement-日本" + NASTY)
    env = {**clean_env(), "PYTHONIOENCODING": "ascii"}
    for args in (["diagnose", str(d)], ["report", str(d), "-o", str(tmp_path / "r.html")]):
        proc = subprocess.run([sys.executable, "-m", "otel_gpu", *args], capture_output=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        proc.stdout.decode("ascii")
        assert b"job entra\\xeenement-\\u65e5\\u672c\\x1b]0;pwned" in proc.stdout, proc.stdout[:300]
