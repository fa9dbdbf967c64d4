"""`trace analyze --csv`: each rank's series and launch-pair files are staged where the rank is
analysed (report_files.RankFileStage) and put in place with the other outputs: the same bytes as
when the main process writes them, and nothing left behind when anything fails on the way."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
from concurrent.futures.process import BrokenProcessPool

import pytest

from otel_gpu.cli import main
from otel_gpu.trace import rank_csv
from otel_gpu.trace.analyze import Options, analyze
from otel_gpu.trace.model import load_set
from otel_gpu.trace.report_files import RankFileStage, csv_files
from kineto import training_trace

RANK_FILES = ("queue_length_series_rank{}.csv", "memory_bw_series_rank{}.csv", "cuda_kernel_launch_stats_rank{}.csv")


def _files(d) -> dict[str, bytes]:
    return {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)}


@pytest.fixture(scope="module")
def trace_set(tmp_path_factory) -> str:
    """Three ranks of a GPU training trace (kernels, launches, copies), one of them slower."""
    d = tmp_path_factory.mktemp("gpu_set")
    for rank in range(3):
        training_trace(rank, compute_scale=1.3 if rank == 2 else 1.0).write(str(d / f"r{rank}.json.gz"))
    return str(d)


def _expected(trace_set: str) -> dict[str, bytes]:
    """Every CSV file as the main process makes it from the packed (compressed) rank files."""
    doc = analyze(load_set(trace_set), Options(), jobs=1)
    return {name: _as_bytes(made) for name, made in csv_files(doc)}


def _as_bytes(made) -> bytes:
    """A file as csv_files makes it (bytes, a str, or str pieces) as its bytes."""
    if isinstance(made, bytes):
        return made
    return (made if isinstance(made, str) else "".join(made)).encode("utf-8")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_staged_rank_files_are_the_packed_ones(trace_set, tmp_path, jobs):
    cdir = tmp_path / "csv"
    assert main(["trace", "analyze", trace_set, "--csv", str(cdir), "--jobs", jobs, "--quiet"]) == 0
    got, want = _files(cdir), _expected(trace_set)
    assert got == want
    assert {n.format(r) for n in RANK_FILES for r in (0, 1, 2)} <= set(got)
    assert got["cuda_kernel_launch_stats_rank1.csv"].count(b"\n") > 10


def test_a_rank_file_that_is_a_folder_is_exit_2_and_leaves_nothing(trace_set, tmp_path, capsys):
    cdir = tmp_path / "csv"
    (cdir / "cuda_kernel_launch_stats_rank1.csv").mkdir(parents=True)
    assert main(["trace", "analyze", trace_set, "--csv", str(cdir), "--jobs", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "is a folder" in err and len(err.splitlines()) == 1
    assert os.listdir(cdir) == ["cuda_kernel_launch_stats_rank1.csv"]   # no temporary, no other file


def test_a_rank_file_linked_elsewhere_is_written_through_its_link(trace_set, tmp_path):
    """A name in the folder that links to another folder is written there (the link stays a link)
    by the main process, whose temporary files stay next to the target."""
    cdir, elsewhere = tmp_path / "csv", tmp_path / "elsewhere"
    cdir.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere / "q0.csv", cdir / "queue_length_series_rank0.csv")
    assert main(["trace", "analyze", trace_set, "--csv", str(cdir), "--jobs", "2", "--quiet"]) == 0
    assert os.path.islink(cdir / "queue_length_series_rank0.csv")
    assert (elsewhere / "q0.csv").read_bytes() == _expected(trace_set)["queue_length_series_rank0.csv"]
    assert os.listdir(elsewhere) == ["q0.csv"]
    assert not [n for n in os.listdir(cdir) if n.startswith(".")]


def test_a_worker_that_dies_while_staging_leaves_nothing(trace_set, tmp_path):
    """A worker process killed after staging some files: the run fails, and close() removes what any
    process staged under this run's tag, and the folder it made."""
    cdir = tmp_path / "csv"
    stage = RankFileStage(str(cdir))

    def keep_then_die(name: str, text: str):
        kept = stage(name, text)
        if name.startswith("memory_bw_series_rank1"):
            os._exit(3)   # the worker dies with files of rank 1 (and maybe rank 0) staged
        return kept
    try:
        with pytest.raises(BrokenProcessPool):
            analyze(load_set(trace_set), Options(), jobs=2, keep_file=keep_then_die)
        assert [n for n in os.listdir(cdir) if stage.tag in n]   # temporary files were left by the dead worker
    finally:
        stage.close()
    assert not cdir.exists()


def test_a_write_that_fails_while_staging_is_one_line_exit_1(trace_set, tmp_path):
    """Files larger than the process may write (RLIMIT_FSIZE: EFBIG, as a full disk gives ENOSPC)
    fail in the workers: one line, exit 1, no output and no temporary file."""
    cdir = tmp_path / "csv"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
    p = subprocess.run([sys.executable, "-m", "otel_gpu.trace", "analyze", trace_set, "--csv", str(cdir), "--jobs", "2",
                        "--quiet"], capture_output=True, text=True, preexec_fn=small_files)
    assert p.returncode == 1, p.stderr
    assert p.stderr.startswith("otel-gpu trace: cannot write outputs: File too large") and \
        len(p.stderr.strip().splitlines()) == 1
    assert not cdir.exists()


def test_without_csv_no_rank_file_is_made(trace_set):
    doc = analyze(load_set(trace_set), Options(), jobs=1, keep_file=None)
    assert doc["_rank_csv"] == [{"series": [], "pairs": []}] * 3
    packed = analyze(load_set(trace_set), Options(), jobs=1)["_rank_csv"]
    assert all(isinstance(kept, bytes) and rank_csv.unpack(kept) for files in packed for kind in files.values()
               for _, kept in kind)
