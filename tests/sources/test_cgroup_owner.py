"""The cgroup path parser: the real layouts of tests/data/cgroup, every layout built from any ids
parses back to them (from any cgroup namespace), and any text gives an owner whose values have their
formats or none, never an exception."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.sources.cgroup_owner import NOBODY, CgroupOwner, owner_from_path, parse_cgroup_file

DATA = Path(__file__).resolve().parents[1] / "data" / "cgroup"
FAST = settings(max_examples=150, deadline=None)
LAYOUTS = [line.split("\t") for line in (DATA / "expected.tsv").read_text().splitlines()[1:]]


@pytest.mark.parametrize("row", LAYOUTS, ids=[r[0] for r in LAYOUTS])
def test_real_layouts(row):
    name, *expected = row
    assert parse_cgroup_file((DATA / name).read_text()) == CgroupOwner(*(v or None for v in expected))


job_ids = st.integers(1, 10**12).map(str)
steps = st.one_of(st.integers(0, 10**6).map(str), st.sampled_from(["batch", "extern", "interactive"]))
uuids = st.uuids().map(str)
container_ids = st.binary(min_size=32, max_size=32).map(bytes.hex)
qos = st.sampled_from(["", "burstable", "besteffort"])
above = st.lists(st.sampled_from(["..", "system.slice", "kubelet.slice", "machine.slice", "user.slice"]), max_size=3)


def _slurm(job, step, layout, uid, prefix):
    if layout == "v2":
        return "/".join(["", *prefix, "system.slice", "slurmstepd.scope", f"job_{job}", f"step_{step}", "user", "task_0"])
    return "/".join(["", *prefix, "slurm", f"uid_{uid}", f"job_{job}", f"step_{step}", "task_1"])


def _pod(pod, cid, q, driver, runtime, prefix):
    if driver == "systemd":
        slice_ = "kubepods" + (f"-{q}" if q else "")
        parts = ["kubepods.slice"] + ([f"{slice_}.slice"] if q else [])
        parts += [f"{slice_}-pod{pod.replace('-', '_')}.slice", f"{runtime}-{cid}.scope"]
    else:
        parts = ["kubepods"] + ([q] if q else []) + [f"pod{pod}", cid]
    return "/".join(["", *prefix, *parts])


@FAST
@given(job_ids, steps, st.sampled_from(["v1", "v2"]), st.integers(0, 2**31), above)
def test_slurm_paths_parse_back(job, step, layout, uid, prefix):
    path = _slurm(job, step, layout, uid, prefix)
    assert owner_from_path(path) == CgroupOwner(slurm_job=job, slurm_step=step)
    v1 = f"4:memory:{path}\n1:name=systemd:/system.slice/slurmd.service\n0::/system.slice/slurmd.service\n"
    assert parse_cgroup_file(v1 if layout == "v1" else f"0::{path}\n").slurm_job == job


@FAST
@given(uuids, container_ids, qos, st.sampled_from(["systemd", "cgroupfs"]),
       st.sampled_from(["cri-containerd", "crio", "docker"]), above, st.booleans())
def test_pod_paths_parse_back(pod, cid, q, driver, runtime, prefix, upper):
    path = _pod(pod.upper() if upper else pod, cid, q, driver, runtime, prefix)
    assert owner_from_path(path) == CgroupOwner(pod_uid=pod, container_id=cid)
    assert parse_cgroup_file(f"0::{path}\n") == CgroupOwner(pod_uid=pod, container_id=cid)


@FAST
@given(uuids, container_ids)
def test_pod_uuid_outside_kubepods_is_no_pod(pod, cid):
    assert owner_from_path(f"/system.slice/pod{pod}/{cid}") == NOBODY


_FORMATS = (r"[0-9]{1,20}", r"[0-9]{1,10}|batch|extern|interactive",
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r"[0-9a-f]{64}")
parts = st.one_of(st.sampled_from(["job_12", "step_0", "step_batch", "kubepods", "kubepods.slice", "..", "",
                                   "pod0f5a7f8c_2b1e_4c55_9d0e_6f7a0c6b1e42.slice", "crio-" + "a" * 64 + ".scope",
                                   "a" * 64, "job_", "step_x", "job_\u0663", "job_7\n"]),
                  st.text(max_size=20))


@FAST
@given(st.one_of(st.text(max_size=400), st.lists(parts, max_size=10).map("/".join),
                 st.lists(st.tuples(st.text(max_size=5), st.lists(parts, max_size=8).map("/".join)), max_size=6)
                 .map(lambda ls: "\n".join(f"{a}:{b}" for a, b in ls))))
def test_any_text_gives_well_formed_values_or_none(text):
    for owner in (parse_cgroup_file(text), owner_from_path(text)):
        for value, fmt in zip(owner, _FORMATS):
            assert value is None or re.fullmatch(fmt, value), (owner, text)
        assert owner.slurm_step is None or owner.slurm_job is not None
        assert owner.container_id is None or owner.pod_uid is not None
