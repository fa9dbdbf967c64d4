"""The embedded default's terminal view, rendered from two real store snapshots."""
from hypothesis import given, settings, strategies as st
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
    assert "40.0/80 GiB" in text
    assert " 50.0%" in text                               # 625 MB/s of a 10 Gb/s link


def test_missing_gpm_shows_a_dash_not_zero():
    store = Store(window_s=10)
    store.put("nvml", [Reading(names.GPU_UTILIZATION, 0.5, GPU), Reading(names.GPU_MEMORY_LIMIT, 1.0, GPU)], 0)
    text = render(node_view(store.snapshot(), store.snapshot(), dt=1.0))
    row = next(line for line in text.splitlines() if "H100" in line)
    assert " 50.0%" in row and "0.0%" not in row.replace(" 50.0%", "")


def busy_node(gpus: int, ifaces: int, ports: int, disks: int, t: float):
    """A store snapshot of a node with that many GPUs (long names), interfaces, IB ports and disks."""
    store = Store(window_s=10)
    readings = []
    for i in range(gpus):
        g = {names.HW_ID: f"GPU-{i:04d}", names.HW_NAME: "NVIDIA H100 80GB HBM3 with a very long board name",
             names.GPU_INDEX: str(i)}
        readings += [Reading(names.GPU_UTILIZATION, 0.99, g), Reading(names.GPU_SM_ACTIVITY, 0.21, g),
                     Reading(names.GPU_TENSOR_ACTIVITY, 0.1, g), Reading(names.GPU_POWER, 650.0, g),
                     Reading(names.GPU_TEMPERATURE, 71.0, g), Reading(names.GPU_MEMORY_USAGE, 79.5 * 2**30, g),
                     Reading(names.GPU_MEMORY_LIMIT, 80 * 2**30, g)]
    store.put("nvml", readings, 0)
    net = []
    for i in range(ifaces):
        e = {names.IFACE: f"enp{i}s0f0np0-long-name"}
        net += [Reading(names.NET_IO, t * 1e8 * (i + 1), {**e, names.DIRECTION: d}) for d in ("receive", "transmit")]
        net.append(Reading(names.NET_LIMIT, 1.25e10, {names.HW_ID: e[names.IFACE], **e}))
    for i in range(ports):
        p = {names.HW_ID: f"mlx5_{i}:1", names.IB_DEVICE: f"mlx5_{i}", names.IB_PORT: "1"}
        net += [Reading(names.IB_IO, t * 2e9, {**p, names.DIRECTION: d}) for d in ("receive", "transmit")]
        net.append(Reading(names.NET_LIMIT, 5e10, p))
    store.put("net", net, 0)
    store.put("disk", [Reading(names.DISK_IO, t * 1e7 * (i + 1), {names.DEVICE: f"nvme{i}n1", names.DISK_DIRECTION: d})
                       for i in range(disks) for d in ("read", "write")], 0)
    store.put("host", [Reading(names.CPU_UTILIZATION, 0.25, {names.CPU_MODE: m}) for m in ("user", "system", "iowait", "idle")]
              + [Reading(names.MEMORY_UTILIZATION, 0.5, {}), Reading(names.LOAD_1M, 12.5, {})], 0)
    return store.snapshot()


def render80(view) -> list[str]:
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(view)
    return console.export_text().rstrip("\n").splitlines()


@settings(max_examples=30, deadline=None)
@given(gpus=st.integers(0, 16), ifaces=st.integers(0, 12), ports=st.integers(0, 8), disks=st.integers(0, 12))
def test_the_view_fits_80x24_with_one_line_per_gpu(gpus, ifaces, ports, disks):
    lines = render80(node_view(busy_node(gpus, ifaces, ports, disks, 2.0), busy_node(gpus, ifaces, ports, disks, 1.0), 1.0))
    assert len(lines) <= 23          # the 24th line is the header run_live prints above it
    assert all(len(line) <= 80 for line in lines)
    rows = [line for line in lines if "H100 80GB" in line]
    assert len(rows) == min(gpus, 8)  # every shown GPU on one line, its name cut, not wrapped
    assert all("99.0%" in r and "21.0%" in r for r in rows)
    if gpus > 8:
        assert any(line.startswith(f"+{gpus - 8} more GPU{'s' if gpus > 9 else ''}:") for line in lines)
    assert any(line.startswith("CPU user") and "load 12.5" in line for line in lines)   # one line, not wrapped


@settings(max_examples=50, deadline=None)
@given(name=st.text(alphabet="[]/ =abc0", min_size=1, max_size=12))
def test_names_from_the_system_are_shown_as_text_never_read_as_markup(name):
    """An interface, disk or GPU name such as 'eth[/0 ]' is drawn as it is: rich markup in a name would
    raise (or restyle the view) inside the live refresh."""
    store = Store(window_s=10)
    g = {names.HW_ID: "GPU-1", names.HW_NAME: name, names.GPU_INDEX: "0"}
    store.put("nvml", [Reading(names.GPU_UTILIZATION, 0.5, g), Reading(names.GPU_MEMORY_LIMIT, 1.0, g)], 0)
    e = {names.IFACE: name}
    store.put("net", [Reading(names.NET_IO, 1.0, {**e, names.DIRECTION: "receive"}),
                      Reading(names.NET_LIMIT, 1.25e9, {names.HW_ID: name, **e})], 0)
    store.put("disk", [Reading(names.DISK_IO, 1.0, {names.DEVICE: name, names.DISK_DIRECTION: "read"})], 0)
    text = render(node_view(store.snapshot(), store.snapshot(), dt=1.0))
    assert text.count(name.strip()[:16].strip()) >= 1
