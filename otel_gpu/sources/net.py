"""OS network interfaces: bytes, packets, errors, drops and link speed.

Counters come from `<proc_root>/net/dev` (one read for every interface; falls back to
`<sys_root>/class/net/<if>/statistics/*`); link speed from `<sys_root>/class/net/<if>/speed`
(Mb/s; -1 or EINVAL when the link is down or the interface is virtual).

`CounterState` (also used by the InfiniBand and disk sources) keeps exported counters
monotonic when a raw counter wraps or is reset by a driver.
"""
from __future__ import annotations

import fnmatch
import os
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable

from .. import names
from ..readings import Reading, SourceError, new_reading
from .procfields import counter, counters, read_text

# /proc/net/dev columns after "iface:", receive then transmit (8 each).
_RX_COLUMNS = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
_TX_COLUMNS = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")
# (spec, /proc/net/dev column, /sys statistics file stem)
_COUNTERS = (
    (names.NET_IO, "bytes", "bytes"),
    (names.NET_PACKETS, "packets", "packets"),
    (names.NET_ERRORS, "errs", "errors"),
    (names.NET_DROPPED, "drop", "dropped"),
)
_DIRECTIONS = (("receive", "rx"), ("transmit", "tx"))
_ROW_KEYS = tuple(f"rx_{c}" for c in _RX_COLUMNS) + tuple(f"tx_{c}" for c in _TX_COLUMNS)
# the exported counters: (spec, direction, row key), in the order they are read
_EXPORTED = tuple((spec, direction, f"{prefix}_{column}") for spec, column, _stem in _COUNTERS
                  for direction, prefix in _DIRECTIONS)
_INDEX = {key: i for i, key in enumerate(_ROW_KEYS)}


# ---- monotonic counters ------------------------------------------------------
class CounterState:
    """Turns raw counter samples into monotonic totals, one per key.

    The first sample of a key is exported as is. After that the total grows by each
    delta. A sample below the previous one is a wrap when `modulus` is given and both
    samples fit in it (delta taken modulo `modulus`), otherwise a reset (the counter
    restarted from 0: delta = the new sample). `update` says which happened.
    """

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[int, int]] = {}  # key -> (raw, total)

    def update(self, key: Hashable, raw: int, modulus: int | None = None) -> tuple[int, str]:
        """Record `raw` for `key`; return (monotonic total, "ok" | "wrap" | "reset")."""
        prev = self._last.get(key)
        if prev is None:
            self._last[key] = (raw, raw)
            return raw, "ok"
        last_raw, total = prev
        status = "ok"
        if raw >= last_raw:
            delta = raw - last_raw
        elif modulus is not None and last_raw < modulus and raw < modulus:
            delta, status = (raw - last_raw) % modulus, "wrap"
        else:
            delta, status = raw, "reset"
        total += delta
        self._last[key] = (raw, total)
        return total, status

    def __contains__(self, key: Hashable) -> bool:
        return key in self._last


# ---- pure parsers ----------------------------------------------------------------
def net_dev_rows(text: str, bad: list[str] | None = None) -> dict[str, list[int]]:
    """Parse `/proc/net/dev` into {iface: its 16 counters} (receive then transmit, in the
    file's column order). A row with a field that is not a non-negative integer is left out and
    described in `bad`."""
    out: dict[str, list[int]] = {}
    for line in text.split("\n"):
        name, sep, rest = line.partition(":")
        if not sep or "|" in line:
            continue
        values = rest.split()
        if len(values) < 16:
            continue
        try:
            out[name.strip()] = counters(values[:16])
        except ValueError as e:
            if bad is not None:
                bad.append(f"{name.strip()}: {e}")
    return out


def parse_net_dev(text: str, bad: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Parse `/proc/net/dev` into {iface: {"rx_bytes": n, ..., "tx_drop": n}} (bytes, packets).
    A row with a field that is not a non-negative integer is left out and described in `bad`."""
    return {name: dict(zip(_ROW_KEYS, row)) for name, row in net_dev_rows(text, bad).items()}


def speed_bytes_per_second(text: str) -> float | None:
    """`/sys/class/net/<if>/speed` (Mb/s) -> bytes/s; None for -1, 0 or junk (link down)."""
    try:
        mbps = int(text.strip())
    except ValueError:
        return None
    return mbps * 1e6 / 8 if mbps > 0 else None


def selected(name: str, include: Iterable[str] | None, exclude: Iterable[str]) -> bool:
    """True when `name` matches an `include` glob (or include is None) and no `exclude` glob."""
    if include is not None and not any(fnmatch.fnmatchcase(name, p) for p in include):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in exclude)


# ---- the source --------------------------------------------------------------------
@dataclass
class _Speed:
    value: float | None
    read_at: float
    error: str | None = None


class NetSource:
    """Per-interface counters (cumulative, monotonic) and link speed (bytes/s).

    `include` / `exclude` are glob patterns on interface names. Link speed is re-read
    at most every `speed_refresh_s` seconds (reading it may take the RTNL lock).
    """

    name = "net"

    def __init__(self, sys_root: str = "/sys", proc_root: str = "/proc",
                 include: Iterable[str] | None = None, exclude: Iterable[str] = ("lo",),
                 speed_refresh_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.sys_root = sys_root
        self.proc_root = proc_root
        self.include = tuple(include) if include is not None else None
        self.exclude = tuple(exclude)
        self.speed_refresh_s = speed_refresh_s
        self.clock = clock
        self.partial_errors = 0
        self.resets = 0
        self._counters = CounterState()
        self._present: set[str] = set()
        self._speeds: dict[str, _Speed] = {}
        self._unreadable: dict[str, str] = {}
        self._origin = ""
        self._dev_path = os.path.join(proc_root, "net", "dev")
        self._had_malformed = False      # rows were left out of an earlier read (listed in describe)
        self._chosen: dict[str, bool] = {}    # interface -> selected by include/exclude
        self._plans: dict[str, tuple] = {}    # interface -> see _plan

    # -- I/O
    def _stats(self) -> dict[str, list[int | None]]:
        """Raw counters per interface (in `_ROW_KEYS` order), from /proc/net/dev or else /sys
        statistics (there, a counter not read is None)."""
        dev = self._dev_path
        try:
            text = read_text(dev)
            self._origin = dev
            bad: list[str] = []
            stats = net_dev_rows(text, bad)
            if bad or self._had_malformed:
                self._malformed(dev, bad)
            return stats
        except OSError as e:
            self._unreadable[dev] = e.strerror or str(e)
        return self._sys_stats()

    def _sys_stats(self) -> dict[str, list[int | None]]:
        base = os.path.join(self.sys_root, "class", "net")
        try:
            ifaces = sorted(os.listdir(base))
        except OSError as e:
            raise SourceError(f"net: neither {self.proc_root}/net/dev nor {base} is readable: {e.strerror}")
        self._origin = base
        out: dict[str, list[int | None]] = {}
        for iface in ifaces:
            if not self._selected(iface):
                continue
            row: list[int | None] | None = [None] * len(_ROW_KEYS)
            for _spec, column, stem in _COUNTERS:
                for _direction, prefix in _DIRECTIONS:
                    path = os.path.join(base, iface, "statistics", f"{prefix}_{stem}")
                    try:
                        row[_INDEX[f"{prefix}_{column}"]] = counter(read_text(path))
                    except FileNotFoundError:
                        row = None  # the interface vanished while we read it
                        break
                    except (OSError, ValueError) as e:
                        self._note(path, e)
                if row is None:
                    break
            if row is not None and any(v is not None for v in row):
                out[iface] = row
        return out

    def _selected(self, iface: str) -> bool:
        """`selected` for this source's globs, remembered per name."""
        known = self._chosen.get(iface)
        if known is None:
            if len(self._chosen) > 4096:   # interfaces come and go (containers): keep it bounded
                self._chosen.clear()
            known = self._chosen[iface] = selected(iface, self.include, self.exclude)
        return known

    def _plan(self, iface: str) -> tuple:
        """An interface's exported counters: (row index, counter key, spec, direction, attributes),
        and its link-speed attributes; built once (readings share the attributes: never mutated)."""
        plan = self._plans.get(iface)
        if plan is None:
            counters_ = tuple((_INDEX[key], (iface, spec.name, direction), spec,
                               {names.IFACE: iface, names.DIRECTION: direction})
                              for spec, direction, key in _EXPORTED)
            limit = {names.HW_ID: iface, names.HW_TYPE: "network", names.IFACE: iface}
            plan = self._plans[iface] = (counters_, limit)
        return plan

    def _speed(self, iface: str) -> float | None:
        now = self.clock()
        cached = self._speeds.get(iface)
        if cached is not None and now - cached.read_at < self.speed_refresh_s:
            return cached.value
        path = os.path.join(self.sys_root, "class", "net", iface, "speed")
        value, error = None, None
        try:
            text = read_text(path)   # a FIFO or device there cannot hold the read
            value = speed_bytes_per_second(text)
            if value is None:
                error = f"{path}: {text.strip()} (link down or no speed)"
        except OSError as e:  # EINVAL for virtual interfaces: an answer, not an error
            error = f"{path}: {e.strerror or e}"
        self._speeds[iface] = _Speed(value, now, error)
        return value

    def _malformed(self, path: str, bad: list[str]) -> None:
        """Rows left out of this read: each one a partial error, listed in describe()."""
        for key in [k for k in self._unreadable if k.startswith(path + " (malformed")]:
            del self._unreadable[key]
        for i, why in enumerate(bad):
            self.partial_errors += 1
            self._unreadable[f"{path} (malformed row {i + 1})"] = why
        self._had_malformed = bool(bad)

    def _note(self, path: str, err: Exception) -> None:
        self.partial_errors += 1
        self._unreadable[path] = getattr(err, "strerror", None) or str(err)

    # -- Source protocol
    def read(self) -> list[Reading]:
        stats = {k: v for k, v in self._stats().items() if self._selected(k)}
        out: list[Reading] = []
        add, update = out.append, self._counters.update
        for iface in sorted(stats):
            row = stats[iface]
            counters_, limit = self._plan(iface)
            for index, key, spec, attrs in counters_:
                raw = row[index]
                if raw is None:
                    continue
                total, status = update(key, raw)
                if status == "reset":
                    self.resets += 1
                    if iface in self._present:  # a reappearing interface starts at 0: fine
                        self.partial_errors += 1
                add(new_reading(Reading, (spec, float(total), attrs)))
            speed = self._speed(iface)
            if speed is not None:
                add(Reading(names.NET_LIMIT, speed, limit))
        if stats.keys() != self._present:
            self._present = set(stats)
            for gone in set(self._speeds) - self._present:
                del self._speeds[gone]
            for gone in set(self._plans) - self._present:
                del self._plans[gone]
        return out

    def describe(self) -> dict:
        if not self._present:
            try:
                self.read()
            except SourceError as e:
                return {"interfaces": [], "unreadable": [str(e)]}
        interfaces = []
        for iface in sorted(self._present):
            speed = self._speeds.get(iface)
            value = speed.value if speed else None
            interfaces.append({"name": iface, "speed_bps": value * 8 if value else None,
                               "limit_bytes_per_s": value})
        unreadable = [f"{p}: {why}" for p, why in sorted(self._unreadable.items())]
        unreadable += [s.error for _, s in sorted(self._speeds.items()) if s.error]
        return {
            "counters_from": self._origin,
            "interfaces": interfaces,
            "include": list(self.include) if self.include is not None else None,
            "exclude": list(self.exclude),
            "counter_resets": self.resets,
            "unreadable": unreadable,
        }
