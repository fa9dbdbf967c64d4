"""Per-rank work in forked workers gives the same document as one process."""
from otel_gpu.trace.analyze import Options, analyze, jsonable
from otel_gpu.trace.model import load_set
from otel_gpu.trace.rank_csv import unpack
from otel_gpu.trace.rank_pool import fork_map
from tests.shared_data import needs_shared_data, shared_data

TRACES = shared_data("traces")


def _square(x: int) -> int:
    return x * x


def test_fork_map_keeps_item_order():
    assert fork_map(_square, list(range(50)), jobs=2) == [x * x for x in range(50)]
    assert fork_map(_square, [], jobs=2) == []


@needs_shared_data("traces", "hta_sampled_2rank")
def test_workers_give_the_same_document():
    ts = load_set(str(TRACES / "hta_sampled_2rank"))
    one, two = analyze(ts, Options(), jobs=1), analyze(ts, Options(), jobs=2)
    assert jsonable(one) == jsonable(two)
    unpacked = [[(name, unpack(b)) for files in doc["_rank_csv"] for kind in ("series", "pairs")
                 for name, b in files[kind]] for doc in (one, two)]
    assert unpacked[0] == unpacked[1]
    assert any(name.startswith("cuda_kernel_launch_stats") and text.count(b"\n") > 1 for name, text in unpacked[0])
