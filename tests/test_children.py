"""Child-process lifetime (otel_gpu.children): /proc parsing and trees as data, then real processes:
a death signal that fires when the starter is SIGKILLed, daemons (setsid, double fork) found again
through the subreaper and ended, SIGTERM-ignoring ones SIGKILLed, signals latched and forwarded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu import children

LINUX = sys.platform.startswith("linux") and os.path.isdir("/proc/self")
needs_linux = pytest.mark.skipif(not LINUX, reason="prctl and /proc are Linux's")


def gone(pid: int) -> bool:
    """No such process, or only its zombie (an exit nobody has collected yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until(predicate, timeout_s: float, poll_s: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll_s)
    return predicate()


def read_pid(path: Path, timeout_s: float = 20.0) -> int:
    assert wait_until(lambda: path.exists() and path.read_text().strip().isdigit(), timeout_s), f"no pid in {path}"
    return int(path.read_text())


def stat_line(pid: int, comm: str, state: str, ppid: int, start: int) -> str:
    rest = [state, ppid, pid, pid] + [0] * 15 + [start] + [0] * 30
    return f"{pid} ({comm}) " + " ".join(map(str, rest))


# --- pure parts -------------------------------------------------------------------------------

@pytest.mark.parametrize("comm", ["sleep", "a b", "x) (y", ")", "((", "tab\there"])
def test_parse_stat_takes_fields_after_the_last_parenthesis(comm):
    proc = children.parse_stat(42, stat_line(42, comm, "S", 7, 123456))
    assert proc == children.Proc(42, 7, 42, "S", 123456)


def test_parse_stat_of_this_process_matches_the_os():
    me = children.read_table()[os.getpid()]
    assert (me.ppid, me.pgid) == (os.getppid(), os.getpgid(0)) and me.state in "RS"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parse_stat_never_raises(text):
    proc = children.parse_stat(1, text)
    assert proc is None or isinstance(proc.start, int)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(1, 40), st.integers(0, 40), max_size=40), st.integers(0, 40))
def test_descendants_are_exactly_what_parent_links_reach(parents, root):
    table = {pid: children.Proc(pid, ppid, pid, "S", 0) for pid, ppid in parents.items()}
    got = [p.pid for p in children.descendants(root, table)]
    expected, frontier = set(), {root}
    while frontier:                                   # the reachable set, computed another way
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier and pid not in expected} - {root}
        expected |= frontier
    assert len(got) == len(set(got)) and set(got) == expected and root not in got


# --- real processes ---------------------------------------------------------------------------

STARTER = """
import signal, subprocess, sys, time
from otel_gpu import children
proc = children.popen([sys.executable, "-c", "import time; time.sleep(120)"], death_signal=signal.SIGTERM)
print(proc.pid, flush=True)
time.sleep(120)
"""


@needs_linux
def test_a_child_gets_its_death_signal_when_the_starter_is_sigkilled():
    starter = subprocess.Popen([sys.executable, "-c", STARTER], stdout=subprocess.PIPE, text=True)
    try:
        child = int(starter.stdout.readline())
        assert not gone(child)
        starter.kill()
        starter.wait()
        assert wait_until(lambda: gone(child), 10), "the child outlived its SIGKILLed starter"
    finally:
        starter.kill()
        starter.wait()
        starter.stdout.close()


@needs_linux
def test_a_child_whose_starter_died_before_the_death_signal_was_set_ends_at_once(tmp_path):
    # the child's parent is not the pid it expects: the check after prctl sends the signal at once
    code = ("import os, signal, time; from otel_gpu import children\n"
            f"children.set_death_signal(signal.SIGTERM, parent=os.getppid() + 1)\n"
            f"open({str(tmp_path / 'alive')!r}, 'w').write('still here')\n")
    proc = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert proc.returncode == -signal.SIGTERM and not (tmp_path / "alive").exists()


@needs_linux
@pytest.mark.parametrize("daemonize", [
    "setsid sleep 300 & echo $! > {pidfile}",
    # a classic double fork: the middle process exits, the grandchild is in a session of its own
    "python3 -c 'import os, sys, time\n"
    "if os.fork(): sys.exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): sys.exit(0)\n"
    "open(sys.argv[1], \"w\").write(str(os.getpid())); time.sleep(300)' {pidfile}",
])
def test_daemons_are_reparented_to_the_subreaper_and_ended(tmp_path, daemonize):
    pidfile = tmp_path / "daemon.pid"
    with children.subreaper() as ok:
        assert ok
        tracker = children.Tracker()
        subprocess.run(["/bin/sh", "-c", daemonize.format(pidfile=pidfile)], timeout=60, check=True)
        daemon = read_pid(pidfile)
        assert wait_until(lambda: children.read_table()[daemon].ppid == os.getpid(), 10)
        leftovers = tracker.new()
        assert [p.pid for p in leftovers] == [daemon]
        assert children.end(leftovers, grace_s=5) == 0          # it went on SIGTERM
        assert gone(daemon)
        tracker.reap_orphans()
        assert daemon not in children.read_table()              # ... and its exit was collected
    assert tracker.new() == []


@needs_linux
def test_a_daemon_that_ignores_sigterm_is_sigkilled_after_the_grace_period(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    script = tmp_path / "stubborn.sh"
    script.write_text(f"trap '' TERM; echo $$ > {pidfile}; while :; do sleep 0.1; done\n")
    with children.subreaper():
        tracker = children.Tracker()
        subprocess.run(["/bin/sh", "-c", f"setsid /bin/sh {script} &"], timeout=60, check=True)
        daemon = read_pid(pidfile)
        t0 = time.monotonic()
        killed = children.end(tracker.new(), grace_s=0.5)
        assert killed >= 1 and 0.4 < time.monotonic() - t0 < 8
        assert gone(daemon)


@needs_linux
def test_processes_that_were_there_before_the_tracker_are_not_touched():
    before = subprocess.Popen(["sleep", "60"])
    try:
        tracker = children.Tracker()
        after = subprocess.Popen(["sleep", "60"])
        assert [p.pid for p in tracker.new()] == [after.pid]
        assert [p.pid for p in tracker.new(exclude=[after.pid])] == []
        assert children.end(tracker.new(), grace_s=5) == 0
        assert after.wait(5) == -signal.SIGTERM and before.poll() is None
    finally:
        before.kill()
        before.wait()


@needs_linux
def test_kill_tree_takes_the_process_and_everything_below_it(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    top = subprocess.Popen(["/bin/sh", "-c", f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait"])
    grandchild = read_pid(pidfile)
    assert children.kill_tree(top.pid) == 2
    assert top.wait(10) == -signal.SIGKILL
    assert wait_until(lambda: gone(grandchild), 10)


def test_signal_latch_records_forwards_and_restores():
    previous = signal.getsignal(signal.SIGHUP)
    seen = []
    with children.SignalLatch() as latch:
        os.kill(os.getpid(), signal.SIGHUP)
        assert wait_until(lambda: latch.received, 5)     # handlers run between bytecodes
        assert latch.stopping == signal.SIGHUP and latch.grace_signal == signal.SIGHUP
        assert latch.first_at is not None
        latch.forward(seen.append)                        # a signal received before is passed at once
        os.kill(os.getpid(), signal.SIGINT)
        assert wait_until(lambda: len(seen) == 2, 5)
    assert seen == [signal.SIGHUP, signal.SIGINT] and latch.grace_signal == signal.SIGHUP
    assert signal.getsignal(signal.SIGHUP) is previous
