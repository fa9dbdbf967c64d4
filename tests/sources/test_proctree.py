"""The processes below given ones (a job's ranks and their DataLoader workers): the children-file
parser (Hypothesis), the walk, a fixture /proc with and without children files (otel-gpu's own helpers
left out), and the real /proc with a process tree started here."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from hypothesis import given, strategies as st

from otel_gpu.sources.proctree import OWN_HELPERS, TreeFinder, descendants, parse_pids

PIDS = st.sets(st.integers(1, 4_194_304), max_size=50)


@given(PIDS, st.sampled_from([" ", "  ", "\n", " \n"]))
def test_children_files_parse_to_their_pids(pids, sep):
    assert parse_pids((sep.join(map(str, sorted(pids))) + " ").encode()) == pids


@given(st.binary(max_size=200))
def test_junk_never_raises_and_gives_only_numbers_in_it(data):
    out = parse_pids(data)
    assert all(str(p).encode() in data for p in out)


def test_descendants_walk_below_the_roots_once_and_stop_at_the_limit():
    tree = {1: {2, 3}, 2: {4}, 4: {2, 5}, 3: set(), 5: set()}       # 4 -> 2 is a loop: followed once
    assert descendants([1], lambda p: tree.get(p, set())) == {2, 3, 4, 5}
    assert descendants([2], lambda p: tree.get(p, set())) == {4, 5}
    assert len(descendants([1], lambda p: tree.get(p, set()), limit=2)) == 2


def _proc(root, pid: int, ppid: int, cmdline: bytes = b"python\0train.py", children: list[int] | None = None,
          threads: int = 1):
    d = root / str(pid)
    (d / "task").mkdir(parents=True)
    (d / "stat").write_text(f"{pid} (py thon) S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 100 1 1\n")
    (d / "cmdline").write_bytes(cmdline)
    for t in range(threads):
        (d / "task" / str(pid + t)).mkdir()
        if children is not None:   # the first thread forked them all
            (d / "task" / str(pid + t) / "children").write_text(" ".join(map(str, children if t == 0 else [])) + " ")


def _job(root, with_children_files: bool):
    c = (lambda kids: kids) if with_children_files else (lambda kids: None)
    helper = b"python\0-c\0import sys; " + OWN_HELPERS[0] + b"; sys.exit(main())\0agent"
    _proc(root, 100, 1, children=c([101, 110, 120, 130]))             # otel-gpu run
    _proc(root, 101, 100, helper, children=c([102]))                  # the node agent (and whatever it starts)
    _proc(root, 102, 101, children=c([]))
    _proc(root, 110, 100, children=c([111, 112]), threads=3)          # torchrun
    _proc(root, 111, 110, children=c([113]))                          # rank 0
    _proc(root, 112, 110, children=c([]))                             # rank 1
    _proc(root, 113, 111, children=c([]))                             # rank 0's DataLoader worker
    _proc(root, 120, 100, b"python\0-c\0x; " + OWN_HELPERS[0] + b"\0diagnose", children=c([]))   # the watcher
    _proc(root, 130, 100, b"/usr/bin/python3\0-m\0otel_gpu.tree_guard\0100", children=c([]))     # the guard
    _proc(root, 200, 1, children=c([201]))                            # another job's rank on a GPU
    _proc(root, 201, 200, children=c([]))                             # its worker


def test_the_job_is_everything_below_run_but_otel_gpus_own_helpers(tmp_path):
    for files in (True, False):   # children files, or the parent pid of every stat file
        root = tmp_path / str(files)
        _job(root, files)
        found = TreeFinder(lambda: [], job_root=100, proc_root=str(root))()
        assert found == {110, 111, 112, 113}, (files, found)
        # a node agent of its own (no job root): the GPU processes' children
        assert TreeFinder(lambda: [111, 200], proc_root=str(root))() == {113, 201}


def test_rescanned_at_most_every_rescan_s(tmp_path):
    _job(tmp_path, True)
    now = [0.0]
    finder = TreeFinder(lambda: [], job_root=100, proc_root=str(tmp_path), rescan_s=5.0, clock=lambda: now[0])
    assert 113 in finder()
    (tmp_path / "111" / "task" / "111" / "children").write_text("113 114 ")
    _proc(tmp_path, 114, 111, children=[])
    now[0] = 4.9
    assert 114 not in finder()
    now[0] = 5.0
    assert {113, 114} <= finder()


def test_real_processes_started_here_are_found(tmp_path):
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "print(c.pid, flush=True); time.sleep(30)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        found = set()
        while child not in found and time.monotonic() < deadline:
            found = TreeFinder(lambda: [], job_root=os.getpid())()
        assert {parent.pid, child} <= found and os.getpid() not in found
    finally:
        parent.kill()
        parent.wait()
        os.kill(child, 9)
