"""The embedded default's terminal view, rendered from two real store snapshots."""
from rich.console import Console

from otel_gpu import names
from otel_gpu.agent.liveview import node_view
from otel_gpu.readings import Reading
from otel_gpu.agent.store import Store

GPU = {names.HW_ID: "GPU-1", names.HW_NAME: "NVIDIA H100 80GB HBM3", names.GPU_INDEX: "0"}
ETH = {names.IFACE: "eth0"}


def snapshot(util, sm, rx_bytes):
    store = Store(window_s=10)
    store.put("nvml", [Reading(names.GPU_UTILIZATION, util, GPU), Reading(names.GPU_SM_ACTIVITY, sm, GPU),
                       Reading(names.GPU_MEMORY_USAGE, 40 * 2**30, GPU), Reading(names.GPU_MEMORY_LIMIT, 80 * 2**30, GPU)], 0)
    store.put("net", [Reading(names.NET_IO, rx_bytes, {**ETH, names.DIRECTION: "receive"}),
                      Reading(names.NET_LIMIT, 1.25e9, {names.HW_ID: "eth0", **ETH})], 0)
    return store.snapshot()


def render(view) -> str:
    console = Console(width=160, record=True, file=open("/dev/null", "w"))
    console.print(view)
    return console.export_text()


def test_utilization_next_to_sm_activity_and_link_share():
    before, after = snapshot(0.99, 0.213, 0), snapshot(0.99, 0.213, 625_000_000)
    text = render(node_view(after, before, dt=1.0))
    assert " 99.0%" in text and " 21.3%" in text          # the "99% busy, 21% SM" story at a glance
    assert "40.0 GiB /   80.0 GiB" in text
    assert " 50.0%" in text                               # 625 MB/s of a 10 Gb/s link


def test_missing_gpm_shows_a_dash_not_zero():
    store = Store(window_s=10)
    store.put("nvml", [Reading(names.GPU_UTILIZATION, 0.5, GPU), Reading(names.GPU_MEMORY_LIMIT, 1.0, GPU)], 0)
    text = render(node_view(store.snapshot(), store.snapshot(), dt=1.0))
    row = next(line for line in text.splitlines() if "H100" in line)
    assert " 50.0%" in row and "0.0%" not in row.replace(" 50.0%", "")
