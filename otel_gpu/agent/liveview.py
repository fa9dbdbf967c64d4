"""The embedded default's terminal view: the node at a glance in an 80x24 terminal, refreshed every interval.

`node_view()` is pure (two store snapshots in, rich renderables out); `run_live()` is the loop.
"""
from __future__ import annotations

import threading
import time

from .. import names, words
from ..safe_text import visible

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


MAX_GPU_ROWS = 8     # one row each; more GPUs are summed up in one line
MAX_NET_ROWS = 3     # the busiest interfaces / IB ports
MAX_DISK_ROWS = 2    # the busiest disks


def _short_name(name: str, width: int = 14) -> str:
    """`NVIDIA H100 80GB HBM3` -> `H100 80GB HBM3`, cut to `width`."""
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name if len(name) <= width else name[:width - 1] + "~"


def _table(*columns: str):
    from rich.table import Table

    t = Table(box=None, padding=(0, 1), pad_edge=False, show_edge=False, header_style="bold")
    for i, col in enumerate(columns):
        t.add_column(col, no_wrap=True, justify="left" if i < 2 else "right")
    return t


GAP = 2   # columns between two table columns (padding 1 on each side, none at the edges)


def _cells(text) -> int:
    """Terminal cells of a cell's text as `_plain` shows it."""
    return _plain(text).cell_len


def _plain(cell):
    """A cell: a str is plain text, never markup, shown `visible` (names come from the system)."""
    from rich.text import Text

    return cell if isinstance(cell, Text) else Text(visible(cell))


def kept_columns(width: int, columns: list[str], priority: list[int], rows: list[list[str]]) -> list[int]:
    """Indices of the columns kept so that every row fits ``width`` unwrapped: the highest priority
    number is left out first (0: always kept), among equals the rightmost (pure)."""
    need = [max([_cells(columns[i])] + [_cells(r[i]) for r in rows]) for i in range(len(columns))]
    kept = list(range(len(columns)))
    for i in sorted((i for i, p in enumerate(priority) if p), key=lambda i: (-priority[i], -i)):
        if sum(need[k] for k in kept) + GAP * (len(kept) - 1) <= width:
            break
        kept.remove(i)
    return kept


class FitColumns:
    """A table of the view at the width it is drawn at: rather than every column cut, the columns
    of least use are left out, and a dim line says which."""

    def __init__(self, columns: list[str], priority: list[int], rows: list[list[str]]):
        self.columns, self.priority, self.rows = columns, priority, rows

    def __rich_console__(self, con, options):
        from rich.text import Text

        width = options.max_width
        kept = kept_columns(width, self.columns, self.priority, self.rows)
        t = _table(*[self.columns[i] for i in kept])
        for r in self.rows:
            t.add_row(*[_plain(r[i]) for i in kept])
        yield t
        order = sorted(range(len(self.columns)), key=lambda i: (-self.priority[i], -i))   # the order they go in
        left = [self.columns[i] for i in order if i not in kept and self.columns[i]]
        if left:
            yield Text(f"(left out: {', '.join(left)})", style="dim", no_wrap=True, overflow="ellipsis")


class FitLine:
    """One line of labelled figures at the width it is drawn at: the parts of least use left out
    (highest priority number first) rather than the line cut."""

    def __init__(self, parts: list[tuple[str, int]], sep: str = " "):
        self.parts, self.sep = parts, sep

    def __rich_console__(self, con, options):
        from rich.text import Text

        width, kept = options.max_width, list(range(len(self.parts)))
        line = lambda: self.sep.join(self.parts[i][0] for i in kept)   # noqa: E731
        for i in sorted((i for i, (_, p) in enumerate(self.parts) if p), key=lambda i: (-self.parts[i][1], -i)):
            if _cells(line()) <= width:
                break
            kept.remove(i)
        yield Text(line(), no_wrap=True, overflow="ellipsis")


def _size(used: float | None, limit: float | None) -> str:
    if used is None or not limit:
        return "-"
    return f"{used / 2**30:.1f}/{limit / 2**30:.0f} GiB"


def node_view(now: Snapshot, prev: Snapshot, dt: float, fake_gpus: bool = False):
    """The node in at most 23 lines of 80 columns: GPUs (one row each, up to 8), one CPU/memory line,
    the busiest network links against their speed, the busiest disks; from two snapshots `dt` s apart.
    Narrower than that, the columns of least use are left out (a line says which) rather than cut.
    ``fake_gpus``: the GPUs are simulated (--fake-gpus), and the view says so above them."""
    from rich.console import Group
    from rich.text import Text

    parts = []
    uuids = sorted(_by(now, names.GPU_MEMORY_LIMIT, names.HW_ID), key=lambda u: _gpu_index(now, u))
    if uuids and fake_gpus:
        parts.append(Text(f"FAKE GPUs (--fake-gpus {len(uuids)}): simulated readings, not this machine's",
                          style="bold yellow", no_wrap=True, overflow="ellipsis"))
    if uuids:
        rows = []
        for uuid in uuids[:MAX_GPU_ROWS]:
            m = {names.HW_ID: uuid}
            failed = _one(now, names.GPU_STATUS, **m, **{names.HW_STATE: "failed"})
            label = next((dict(a).get(names.HW_NAME, "") for a in now.get(names.GPU_MEMORY_LIMIT.name, {})
                          if dict(a).get(names.HW_ID) == uuid), "")
            power, temp = _one(now, names.GPU_POWER, **m), _one(now, names.GPU_TEMPERATURE, **m)
            rows.append([str(_gpu_index(now, uuid)), Text("LOST", style="red") if failed else _short_name(label),
                         _pct(_one(now, names.GPU_UTILIZATION, **m)), _pct(_one(now, names.GPU_SM_ACTIVITY, **m)),
                         _pct(_one(now, names.GPU_TENSOR_ACTIVITY, **m)),
                         _size(_one(now, names.GPU_MEMORY_USAGE, **m), _one(now, names.GPU_MEMORY_LIMIT, **m)),
                         "-" if power is None else f"{power:.0f} W", "-" if temp is None else f"{temp:.0f} C"])
        # narrower than ~62 columns: temperature, then power, tensor activity and the name are left out
        parts.append(FitColumns(["GPU", "name", "util", "SM act", "tensor", "memory", "power", "temp"],
                                [0, 1, 0, 0, 2, 0, 3, 4], rows))
        rest = uuids[MAX_GPU_ROWS:]
        if rest:
            utils = [u for u in (_one(now, names.GPU_UTILIZATION, **{names.HW_ID: x}) for x in rest) if u is not None]
            sms = [u for u in (_one(now, names.GPU_SM_ACTIVITY, **{names.HW_ID: x}) for x in rest) if u is not None]
            parts.append(Text(f"+{words.count(len(rest), 'more GPU', 'more GPUs')}: mean util {_pct(sum(utils) / len(utils) if utils else None)}, "
                              f"SM act {_pct(sum(sms) / len(sms) if sms else None)}", style="dim", no_wrap=True))

    cpu = [f"{label} {_pct(_one(now, names.CPU_UTILIZATION, **{names.CPU_MODE: m})).strip()}"
           for label, m in (("user", "user"), ("sys", "system"), ("iowait", "iowait"), ("idle", "idle"))]
    load = _one(now, names.LOAD_1M)
    # narrow: the idle share (100% less the others), the load average, then the system share are left out
    parts.append(FitLine([("CPU", 0), (cpu[0], 0), (cpu[1], 1), (cpu[2], 0), (cpu[3], 3),
                          (f" memory {_pct(_one(now, names.MEMORY_UTILIZATION)).strip()}", 0)]
                         + ([] if load is None else [(f" load {load:.1f}", 2)])))

    links = []
    for iface in _by(now, names.NET_IO, names.IFACE):
        m = {names.IFACE: iface}
        rx = _rate(now, prev, dt, names.NET_IO, **m, **{names.DIRECTION: "receive"})
        tx = _rate(now, prev, dt, names.NET_IO, **m, **{names.DIRECTION: "transmit"})
        links.append((iface, rx, tx, _one(now, names.NET_LIMIT, **{names.HW_ID: iface})))
    for port in _by(now, names.IB_IO, names.HW_ID):
        m = {names.HW_ID: port}
        links.append((f"IB {port}", _rate(now, prev, dt, names.IB_IO, **m, **{names.DIRECTION: "receive"}),
                      _rate(now, prev, dt, names.IB_IO, **m, **{names.DIRECTION: "transmit"}),
                      _one(now, names.NET_LIMIT, **m)))
    if links:
        links.sort(key=lambda x: (-((x[1] or 0) + (x[2] or 0)), x[0]))
        rows = [[name[:16], "", _bytes(rx, True), _bytes(tx, True), _bytes(limit, True),
                 _pct(rx / limit) if rx is not None and limit else "-",
                 _pct(tx / limit) if tx is not None and limit else "-"] for name, rx, tx, limit in links[:MAX_NET_ROWS]]
        # narrow: the link speed (and the spacer column) are left out first, the shares of it stay longer
        parts.append(FitColumns(["link", "", "rx", "tx", "speed", "rx %", "tx %"], [0, 2, 0, 0, 2, 1, 1], rows))
        if len(links) > MAX_NET_ROWS:
            parts.append(Text(f"+{words.count(len(links) - MAX_NET_ROWS, 'quieter link')}", style="dim"))

    disks = []
    for dev in _by(now, names.DISK_IO, names.DEVICE):
        m = {names.DEVICE: dev}
        disks.append((dev, _rate(now, prev, dt, names.DISK_IO, **m, **{names.DISK_DIRECTION: "read"}),
                      _rate(now, prev, dt, names.DISK_IO, **m, **{names.DISK_DIRECTION: "write"})))
    if disks:
        disks.sort(key=lambda x: (-((x[1] or 0) + (x[2] or 0)), x[0]))
        table = _table("disk", "", "read", "write")
        for dev, r, w in disks[:MAX_DISK_ROWS]:
            table.add_row(_plain(dev[:16]), "", _bytes(r, True), _bytes(w, True))
        parts.append(table)
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


def header_line(outputs: str, interval_s: float):
    """The view's first line: where the metrics go, how often, how to stop; one line at any width
    (cut with an ellipsis, the outputs first)."""
    from rich.table import Table
    from rich.text import Text

    line = Table.grid()   # a grid column, not a Text: a printed Text wraps whatever its no_wrap says
    line.add_column(no_wrap=True, overflow="ellipsis", style="dim")
    line.add_row(Text(f"{outputs or 'no outputs'} | every {interval_s:g} s | Ctrl-C stops"))
    return line


def run_live(store, interval_s: float, stop: threading.Event, header: str, fake_gpus: bool = False) -> None:
    """Redraw the view every `interval_s` seconds (at least 0.5 s) until `stop` is set; ``header``:
    where the metrics go (printed once, in the view's first line)."""
    from rich.console import Group
    from rich.live import Live

    period = max(0.5, interval_s)
    prev, prev_t = store.snapshot(), time.monotonic()
    from rich.text import Text

    with Live(Group(header_line(header, interval_s), Text("collecting ...")), refresh_per_second=4,
              screen=False) as live:
        while not stop.wait(period):
            now, now_t = store.snapshot(), time.monotonic()
            live.update(Group(header_line(header, interval_s), node_view(now, prev, now_t - prev_t, fake_gpus)))
            prev, prev_t = now, now_t
