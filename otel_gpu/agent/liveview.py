"""The embedded default's terminal view: the node at a glance, refreshed every interval.

`node_view()` is pure (two store snapshots in, rich renderables out); `run_live()` is the loop.
"""
from __future__ import annotations

import threading
import time

from .. import names

Snapshot = dict  # name -> {attrs_tuple: value}


def _by(snapshot: Snapshot, spec, key: str) -> dict[str, dict]:
    """Series of `spec` grouped by attribute `key`: {key value: {attrs: value}}."""
    out: dict[str, dict] = {}
    for attrs, value in snapshot.get(spec.name, {}).items():
        d = dict(attrs)
        out.setdefault(d.get(key, ""), {})[attrs] = value
    return out


def _one(snapshot: Snapshot, spec, **match) -> float | None:
    for attrs, value in snapshot.get(spec.name, {}).items():
        d = dict(attrs)
        if all(d.get(k) == v for k, v in match.items()):
            return value
    return None


def _rate(now: Snapshot, prev: Snapshot, dt: float, spec, **match) -> float | None:
    a, b = _one(prev, spec, **match), _one(now, spec, **match)
    if a is None or b is None or dt <= 0:
        return None
    return max(0.0, (b - a) / dt)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:5.1f}%"


def _bytes(x: float | None, per_s: bool = False) -> str:
    if x is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:6.1f} {unit}{'/s' if per_s else ''}"
        x /= 1024
    return "-"


def node_view(now: Snapshot, prev: Snapshot, dt: float):
    """Tables for GPUs, network (against link speed), disks and CPU from two snapshots `dt` s apart."""
    from rich.console import Group
    from rich.table import Table

    gpus = Table(title="GPUs", expand=True)
    for col in ("GPU", "name", "util", "SM activity", "tensor", "memory", "power", "temp"):
        gpus.add_column(col)
    for uuid in sorted(_by(now, names.GPU_MEMORY_LIMIT, names.HW_ID), key=lambda u: _gpu_index(now, u)):
        m = {names.HW_ID: uuid}
        used, limit = _one(now, names.GPU_MEMORY_USAGE, **m), _one(now, names.GPU_MEMORY_LIMIT, **m)
        status_failed = _one(now, names.GPU_STATUS, **m, **{names.HW_STATE: "failed"})
        label = next((dict(a).get(names.HW_NAME, "") for a in now.get(names.GPU_MEMORY_LIMIT.name, {}) if dict(a).get(names.HW_ID) == uuid), "")
        gpus.add_row(str(_gpu_index(now, uuid)), label + (" [red]LOST[/]" if status_failed else ""),
                     _pct(_one(now, names.GPU_UTILIZATION, **m)), _pct(_one(now, names.GPU_SM_ACTIVITY, **m)),
                     _pct(_one(now, names.GPU_TENSOR_ACTIVITY, **m)),
                     f"{_bytes(used)} / {_bytes(limit)}" if used is not None and limit else "-",
                     "-" if _one(now, names.GPU_POWER, **m) is None else f"{_one(now, names.GPU_POWER, **m):.0f} W",
                     "-" if _one(now, names.GPU_TEMPERATURE, **m) is None else f"{_one(now, names.GPU_TEMPERATURE, **m):.0f} C")

    net = Table(title="Network (share of link speed)", expand=True)
    for col in ("interface", "rx", "tx", "link", "rx %", "tx %"):
        net.add_column(col)
    for iface in sorted(_by(now, names.NET_IO, names.IFACE)):
        m = {names.IFACE: iface}
        rx = _rate(now, prev, dt, names.NET_IO, **m, **{names.DIRECTION: "receive"})
        tx = _rate(now, prev, dt, names.NET_IO, **m, **{names.DIRECTION: "transmit"})
        limit = _one(now, names.NET_LIMIT, **{names.HW_ID: iface})
        net.add_row(iface, _bytes(rx, True), _bytes(tx, True), _bytes(limit, True),
                    _pct(rx / limit) if rx is not None and limit else "-", _pct(tx / limit) if tx is not None and limit else "-")
    for port in sorted(_by(now, names.IB_IO, names.HW_ID)):
        m = {names.HW_ID: port}
        rx = _rate(now, prev, dt, names.IB_IO, **m, **{names.DIRECTION: "receive"})
        tx = _rate(now, prev, dt, names.IB_IO, **m, **{names.DIRECTION: "transmit"})
        limit = _one(now, names.NET_LIMIT, **m)
        net.add_row(f"IB {port}", _bytes(rx, True), _bytes(tx, True), _bytes(limit, True),
                    _pct(rx / limit) if rx is not None and limit else "-", _pct(tx / limit) if tx is not None and limit else "-")

    disks = Table(title="Disks", expand=True)
    for col in ("device", "read", "write"):
        disks.add_column(col)
    for dev in sorted(_by(now, names.DISK_IO, names.DEVICE)):
        m = {names.DEVICE: dev}
        disks.add_row(dev, _bytes(_rate(now, prev, dt, names.DISK_IO, **m, **{names.DISK_DIRECTION: "read"}), True),
                      _bytes(_rate(now, prev, dt, names.DISK_IO, **m, **{names.DISK_DIRECTION: "write"}), True))

    cpu = Table(title="CPU and memory", expand=True)
    for col in ("user", "system", "iowait", "idle", "memory used", "load 1m"):
        cpu.add_column(col)
    cpu.add_row(*(_pct(_one(now, names.CPU_UTILIZATION, **{names.CPU_MODE: m})) for m in ("user", "system", "iowait", "idle")),
                _pct(_one(now, names.MEMORY_UTILIZATION)),
                "-" if _one(now, names.LOAD_1M) is None else f"{_one(now, names.LOAD_1M):.2f}")
    parts = [t for t in (gpus, net, disks, cpu) if t.row_count]
    return Group(*parts)


def _gpu_index(snapshot: Snapshot, uuid: str) -> int:
    for attrs in snapshot.get(names.GPU_MEMORY_LIMIT.name, {}):
        d = dict(attrs)
        if d.get(names.HW_ID) == uuid:
            try:
                return int(d.get(names.GPU_INDEX, 0))
            except ValueError:
                return 0
    return 0


def run_live(store, interval_s: float, stop: threading.Event, header: str) -> None:
    """Redraw the view every `interval_s` seconds (at least 0.5 s) until `stop` is set."""
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    period = max(0.5, interval_s)
    prev, prev_t = store.snapshot(), time.monotonic()
    with Live(Text("collecting ..."), refresh_per_second=4, screen=False) as live:
        while not stop.wait(period):
            now, now_t = store.snapshot(), time.monotonic()
            live.update(Group(Text(header + "   (Ctrl-C to stop)", style="dim"), node_view(now, prev, now_t - prev_t)))
            prev, prev_t = now, now_t
