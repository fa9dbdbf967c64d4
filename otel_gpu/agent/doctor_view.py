"""`otel-gpu doctor` as tables (pure: the report dict in, rich renderables out).

Per source: one key/value table of its scalar facts, one table per list of records (GPUs,
interfaces, disks, ports, NVML field costs) with a column per field, and its unreadable paths as
plain lines. Titles are lines of their own (a table's title would wrap to the table's width);
sizes and rates show in human units (`--json` keeps the exact numbers). Every text is plain (never
rich markup) and shown `safe_text.visible`: device, interface and path names come from the system.
"""
from __future__ import annotations

from typing import Any

from ..safe_text import visible

LONG_LIST = 4   # lists longer than this show as a count in a record table
WIDE = 6        # records with more fields than this show one key/value table each
_BYTES = ("memory_total", "swap_total")


def human(value: float, unit: str, base: int) -> str:
    """`value` with an SI (base 1000) or IEC (base 1024) prefix: 25276514304 B -> '23.5 GiB'."""
    prefixes = ("", "Ki", "Mi", "Gi", "Ti", "Pi") if base == 1024 else ("", "k", "M", "G", "T", "P")
    v, i = float(value), 0
    while abs(v) >= base and i < len(prefixes) - 1:
        v /= base
        i += 1
    return f"{v:.3g} {prefixes[i]}{unit}"


def _units(key: str) -> tuple[str, int] | None:
    """(unit, base) for a fact whose name says it is a size or a rate, else None."""
    if key.endswith("_bps"):
        return "bit/s", 1000
    if key.endswith("_bytes_per_s"):
        return "B/s", 1000
    if key.endswith("_bytes") or key in _BYTES:
        return "B", 1024
    return None


def cell(value: Any, in_record: bool = False, key: str = "") -> str:
    """One value as table text: lists joined (long ones counted in records), dicts as k=v, None as -,
    sizes and rates (by their key's name) in human units."""
    if value is None or value == "" or value == [] or value == {}:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    units = _units(key) if isinstance(value, (int, float)) else None
    if units is not None:
        return human(value, *units)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={cell(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        if in_record and len(value) > LONG_LIST:
            return f"{len(value)} ({', '.join(map(str, value[:2]))}, ...)"
        return ", ".join(cell(v) for v in value)
    return str(value)


def _is_records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _title(text: str):
    from rich.text import Text

    return Text(visible(text), style="bold", no_wrap=True, overflow="ellipsis")


def _plain(text: str, style: str = ""):
    """A table cell or line: plain text, shown `visible`."""
    from rich.text import Text

    return Text(visible(text), style=style)


def source_tables(name: str, info: dict) -> list:
    """The renderables of one source's `describe()`."""
    from rich.table import Table

    out: list = []
    facts = Table(show_header=False, box=None, padding=(0, 2))
    facts.add_column("fact", style="dim", no_wrap=True)
    facts.add_column("value", overflow="fold")
    lines: list[str] = []
    records: list[tuple[str, list[dict]]] = []
    for key, value in info.items():
        if key == "source":
            continue
        if _is_records(value):
            records.append((key, value))
        elif key == "unreadable" and isinstance(value, list):
            lines += [str(v) for v in value]
        else:
            facts.add_row(_plain(key), _plain(cell(value, key=key)))
    if facts.row_count:
        out += [_title(name), facts]
    for key, rows in records:
        columns = [c for c in dict.fromkeys(k for r in rows for k in r)
                   if any(cell(r.get(c)) != "-" for r in rows)]   # columns empty in every row left out
        if len(columns) > WIDE:
            for i, r in enumerate(rows):
                t = Table(show_header=False, box=None, padding=(0, 2))
                t.add_column("field", style="dim", no_wrap=True)
                t.add_column("value", overflow="fold")
                for c in columns:
                    t.add_row(_plain(c), _plain(cell(r.get(c), key=c)))
                out += [_title(f"{name}: {key} {r.get('index', i)}"), t]
            continue
        t = Table(padding=(0, 1))
        for c in columns:
            t.add_column(_plain(c), overflow="fold")
        for r in rows:
            t.add_row(*(_plain(cell(r.get(c), in_record=True, key=c)) for c in columns))
        out += [_title(f"{name}: {key}"), t]
    if lines:
        out.append(_plain(f"{name}: unreadable", style="yellow"))
        out += [_plain(f"  {line}", style="yellow") for line in lines]
    return out


def doctor_view(report: dict):
    from rich.console import Group
    from rich.text import Text

    parts: list = [_plain(n, style="yellow") for n in report.get("notes", [])]
    for name, info in report.get("sources", {}).items():
        parts += source_tables(name, info if isinstance(info, dict) else {"value": info})
        parts.append(Text(""))
    return Group(*parts)
