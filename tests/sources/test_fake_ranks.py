"""Fake GPUs list the named ranks by local rank (sources/fake_ranks.py), from a fixture /proc."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from otel_gpu.sources.fake_nvml import FakeNvml, hopper
from otel_gpu.sources.fake_ranks import adopter, local_rank, placement

from fstree import write_tree


def _proc(pid: int, ppid: int, env: dict[str, str]) -> dict[str, bytes]:
    return {f"{pid}/environ": b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0",
            f"{pid}/stat": f"{pid} (python) S {ppid} 1 1 0 -1 0".encode()}


def test_ranks_by_local_rank_without_their_workers_or_the_launcher(tmp_path):
    root = write_tree(tmp_path, {**_proc(10, 1, {"PATH": "/bin"}),                     # torchrun: no rank
                                 **_proc(11, 10, {"RANK": "0", "LOCAL_RANK": "0"}),
                                 **_proc(12, 10, {"RANK": "1", "LOCAL_RANK": "1"}),
                                 **_proc(13, 11, {"RANK": "0", "LOCAL_RANK": "0"}),    # rank 0's DataLoader worker
                                 **_proc(14, 1, {"RANK": "5"})})                       # a rank without LOCAL_RANK
    assert placement([10, 11, 12, 13, 14, 99], str(root)) == {0: [11, 14], 1: [12]}
    fake = FakeNvml(gpus=[hopper(), hopper()], costs={})
    fake.adopt(adopter(lambda: [11, 12, 13], str(root)))
    fake.nvmlInit()
    pids = [[p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(i))]
            for i in (0, 1)]
    assert pids == [[11], [12]]


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["LOCAL_RANK", "RANK", "SLURM_PROCID", "X"]), st.text(max_size=6)))
def test_local_rank_is_a_digit_string_or_zero_for_a_rank_or_none(env):
    got = local_rank(env)
    text = env.get("LOCAL_RANK", "").strip()
    if text.isascii() and text.isdigit():
        assert got == int(text)
    elif any(env.get(k, "").strip() for k in ("RANK", "SLURM_PROCID")):
        assert got == 0
    else:
        assert got is None
