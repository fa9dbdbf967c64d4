"""`otel-gpu agent`'s live view in a real pseudo-terminal of 60x24, 80x24 and 120x24: every frame fits
(no line wider than the terminal, no more lines than it has), the metrics URL is printed once per frame
and nowhere else, and fake GPUs say they are fake; narrower than 80 columns the columns of least use
are left out, named, never cut."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

import pytest
from rich.cells import cell_len
from rich.console import Console

from otel_gpu.agent.liveview import header_line, node_view
from tests.agent.test_liveview import busy_node
from tests.childenv import clean_env
from tests.servers import free_port

CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
REDRAW = re.compile(r"\r(?:\x1b\[2K\x1b\[1A)*\x1b\[2K")   # rich Live: erase the frame, line by line upwards


def run_in_pty(argv: list[str], cols: int, rows: int, seconds: float) -> str:
    """What `argv` writes to a terminal of cols x rows in `seconds`, then after Ctrl-C (SIGINT)."""
    pid, fd = pty.fork()
    if pid == 0:   # the child: the terminal's size is set before it starts (it reads it once)
        try:
            os.execvpe(argv[0], argv, {**clean_env(), "TERM": "xterm-256color", "COLUMNS": "", "LINES": ""})
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    out, end, sent = b"", time.monotonic() + seconds, False
    try:
        while True:
            if not sent and time.monotonic() >= end:
                os.kill(pid, signal.SIGINT)
                sent, end = True, time.monotonic() + 10
            elif sent and time.monotonic() >= end:
                break
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:   # the child closed the terminal
                    break
                if not chunk and sent:
                    break
                out += chunk
    finally:
        if os.waitpid(pid, os.WNOHANG) == (0, 0):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace")


def frames(raw: str) -> list[list[str]]:
    """The screens drawn: each as its lines, escape sequences removed."""
    shots = []
    for part in REDRAW.split(raw.replace("\x1b[?25l", "").replace("\x1b[?25h", "")):
        lines = CSI.sub("", part).replace("\r\n", "\n").strip("\n").split("\n")
        if any(line.strip() for line in lines):
            shots.append(lines)
    return shots


@pytest.mark.slow
@pytest.mark.parametrize("cols", [60, 80, 120])
def test_the_live_view_fits_the_terminal_and_says_the_url_once(cols):
    port = free_port()
    raw = run_in_pty([sys.executable, "-m", "otel_gpu", "agent", "--fake-gpus", "8", "--live",
                      "--prometheus-port", str(port), "--interval", "0.5"], cols, 24, 3.5)
    url = f"http://127.0.0.1:{port}/metrics"
    shots = [s for s in frames(raw) if any("GPU" in line for line in s)]
    assert shots, raw[-2000:]
    for shot in shots:
        assert len(shot) <= 24, "\n".join(shot)
        assert all(cell_len(line) <= cols for line in shot), "\n".join(line for line in shot if cell_len(line) > cols)
        assert shot[0].startswith("Prometheus metrics on " + url) and ("Ctrl-C" in shot[0] or cols < 80)
        assert sum(line.count(url) for line in shot) == 1
        gpu_head = next(line for line in shot if line.startswith("GPU "))
        assert gpu_head.split()[:5] == ["GPU", "name", "util", "SM", "act"] and "…" not in gpu_head
        assert any(line.startswith("(left out: temp, power)") for line in shot) is (cols == 60)
        assert shot[1].startswith("FAKE GPUs (--fake-gpus 8)")
        assert sum(1 for line in shot if re.match(r"\d+ +H100 80GB HBM3 ", line)) == 8
    plain = CSI.sub("", raw)
    assert plain.count(url) == plain.count("Prometheus metrics on " + url)   # never outside the view's first line


def render(width: int, view) -> list[str]:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(view)
    return console.export_text().rstrip("\n").splitlines()


@pytest.mark.parametrize("fake", [True, False])
def test_fake_gpus_are_marked_and_real_ones_not(fake):
    now, prev = busy_node(12, 3, 1, 3, 2.0), busy_node(12, 3, 1, 3, 1.0)
    lines = render(80, node_view(now, prev, 1.0, fake_gpus=fake))
    assert (lines[0].startswith("FAKE GPUs (--fake-gpus 12)")) is fake
    assert len(lines) <= 23 and all(cell_len(line) <= 80 for line in lines)
    assert any(line.startswith("+4 more GPUs:") for line in lines)
    assert any(line.startswith("+1 quieter link") and "links" not in line for line in lines)


@pytest.mark.parametrize("width", [40, 80, 120])
def test_the_header_is_one_line_at_any_width(width):
    long = "Prometheus metrics on http://127.0.0.1:9464/metrics; OTLP (http/protobuf) to http://collector:4318 every 5 s"
    for outputs in (long, "Prometheus metrics on http://127.0.0.1:9464/metrics", ""):
        lines = render(width, header_line(outputs, 0.5))
        assert len(lines) == 1 and cell_len(lines[0]) <= width
        assert lines[0].startswith((outputs or "no outputs")[:width - 1])


@pytest.mark.parametrize("width, gone", [(45, ["temp", "power", "tensor", "name"]), (60, ["temp", "power"]),
                                         (66, ["temp"]), (69, [])])
def test_a_narrow_view_leaves_columns_out_instead_of_cutting_them(width, gone):
    now, prev = busy_node(12, 3, 1, 3, 2.0), busy_node(12, 3, 1, 3, 1.0)
    lines = render(width, node_view(now, prev, 1.0, fake_gpus=True))
    assert len(lines) <= 23 and all(cell_len(line) <= width for line in lines), "\n".join(lines)
    head = lines.index(next(line for line in lines if line.startswith("GPU ")))
    rows = lines[head + 1:head + 9]
    assert all(re.match(r"\d+ ", row) for row in rows) and not any("…" in x for x in lines[head:head + 9])
    assert all(re.search(r"99\.0% +21\.0% .*79\.5/80 GiB", row) for row in rows)   # nothing cut, only left out
    shown = [c for c in ("name", "util", "SM act", "tensor", "memory", "power", "temp") if c in lines[head]]
    assert shown == [c for c in ("name", "util", "SM act", "tensor", "memory", "power", "temp") if c not in gone]
    # the line under the GPUs names what was left out, the least useful first
    more = "+4 more GPUs: mean util  99.0%, SM act  21.0%"
    assert lines[head + 9] == (f"(left out: {', '.join(gone)})" if gone else more)
    link = next(line for line in lines if line.startswith("link "))
    assert "rx" in link.split() and "…" not in link
    cpu = next(line for line in lines if line.startswith("CPU "))
    assert re.fullmatch(r"CPU user 25\.0% .*iowait 25\.0%  memory 50\.0%.*", cpu), cpu   # never cut mid-figure
