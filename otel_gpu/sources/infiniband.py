"""InfiniBand / RoCE ports from `<sys_root>/class/infiniband/<dev>/ports/<n>/`.

RDMA traffic bypasses the kernel's network stack, so it only shows here, not in
/proc/net/dev. `port_xmit_data` / `port_rcv_data` count 4-byte words. The 64-bit
`counters_ext/*_64` files are used when present; `counters/*` may be 32-bit (it wraps,
or saturates at 2**32-1 per the IB spec) or 64-bit, depending on the kernel and HCA.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from .. import names
from ..readings import Reading, SourceError
from .net import CounterState
from .procfields import read_text

WORD = 4  # bytes per data-counter unit
MOD32 = 2**32

# quantity -> (spec, direction, files that may hold it: 64-bit first, then the basic one)
_TRAFFIC = {
    "xmit_data": (names.IB_IO, "transmit", ("counters_ext/port_xmit_data_64", "counters/port_xmit_data")),
    "rcv_data": (names.IB_IO, "receive", ("counters_ext/port_rcv_data_64", "counters/port_rcv_data")),
    "xmit_packets": (names.IB_PACKETS, "transmit", ("counters_ext/port_xmit_packets_64", "counters/port_xmit_packets")),
    "rcv_packets": (names.IB_PACKETS, "receive", ("counters_ext/port_rcv_packets_64", "counters/port_rcv_packets")),
}

# Error counters in counters/ (each reported with error.type = its file name, when present).
ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped", "port_rcv_discards",
)

_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)b/sec", re.IGNORECASE)
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


# ---- pure parsers ------------------------------------------------------------------
def parse_rate(text: str) -> float | None:
    """`rate` ("100 Gb/sec (4X EDR)") -> bytes/s, or None when unparsable."""
    m = _RATE.match(text)
    if not m:
        return None
    return float(m.group(1)) * _SCALE[m.group(2).upper()] / 8


def parse_state(text: str) -> tuple[int, str] | None:
    """`state` ("4: ACTIVE") -> (4, "ACTIVE"), or None."""
    num, sep, label = text.strip().partition(":")
    try:
        return int(num), label.strip() if sep else ""
    except ValueError:
        return None


def parse_counter(text: str) -> int | None:
    """A counter file -> int; None for "N/A (no PMA)" (the HCA has no performance agent)."""
    try:
        return int(text.strip())
    except ValueError:
        return None


def pick(values: list[int | None]) -> int | None:
    """The value of one quantity from its 64-bit and basic files: the larger one.

    A good 64-bit counter is never below the basic one (that one is the same count or
    its 32-bit truncation); some drivers (mlx4) leave the 64-bit packet counters at 0
    while the basic ones count, so the larger one is right in both cases.
    """
    present = [v for v in values if v is not None]
    return max(present) if present else None


# ---- the source ----------------------------------------------------------------------
@dataclass
class _Plan:
    """Which files to read for one port, found once (each counter read may be a MAD query
    to the HCA, so files that are missing, N/A or redundant are not read again)."""

    pdir: str
    traffic: dict[str, list[str]]  # quantity -> existing candidate files, 64-bit first
    chosen: dict[str, str] = field(default_factory=dict)  # quantity -> the file in use
    errors: dict[str, str] = field(default_factory=dict)  # error type -> file
    link_layer: str | None = None
    dead: set[str] = field(default_factory=set)  # files that read "N/A (no PMA)"
    stale: bool = False


class InfinibandSource:
    """Per-port data bytes, packets, error counters, link rate and up/down."""

    name = "infiniband"

    def __init__(self, sys_root: str = "/sys"):
        self.sys_root = sys_root
        self.base = os.path.join(sys_root, "class", "infiniband")
        self.partial_errors = 0
        self.wraps = 0
        self.resets = 0
        self._counters = CounterState()
        self._plans: dict[tuple[str, str], _Plan] = {}
        self._ports: list[dict] = []
        self._unreadable: dict[str, str] = {}
        self._no_pma: set[str] = set()
        self._saturated: set[str] = set()

    def _read(self, path: str) -> str | None:
        """File text, or None when absent. Other failures are noted as partial errors."""
        try:
            return read_text(path).encode("utf-8", "surrogateescape").decode("ascii", "replace")
        except FileNotFoundError:
            return None
        except OSError as e:
            self.partial_errors += 1
            self._unreadable[path] = e.strerror or str(e)
            return None

    def _counter(self, plan: _Plan, rel: str) -> int | None:
        path = os.path.join(plan.pdir, rel)
        text = self._read(path)
        if text is None:
            plan.stale = True  # gone or failing: look at the port afresh next time
            return None
        value = parse_counter(text)
        if value is None:
            self._no_pma.add(f"{path}: {text.strip()}")
            plan.dead.add(rel)
        elif value == MOD32 - 1:
            self._saturated.add(path)
        return value

    def ports(self) -> list[tuple[str, str]]:
        """(device, port) pairs present now."""
        try:
            devices = sorted(os.listdir(self.base))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise SourceError(f"infiniband: {self.base}: {e.strerror}")
        out = []
        for dev in devices:
            try:
                out += [(dev, p) for p in sorted(os.listdir(os.path.join(self.base, dev, "ports")), key=_num)]
            except OSError:
                continue  # device removed, or no ports folder
        return out

    def _plan(self, dev: str, port: str) -> _Plan | None:
        pdir = os.path.join(self.base, dev, "ports", port)
        present = set()
        for sub in ("counters", "counters_ext"):
            try:
                present |= {f"{sub}/{name}" for name in os.listdir(os.path.join(pdir, sub))}
            except FileNotFoundError:
                continue
            except OSError as e:
                self._unreadable[os.path.join(pdir, sub)] = e.strerror or str(e)
        if not present and not os.path.isdir(pdir):
            return None  # the port went away while we listed it
        plan = _Plan(pdir, {q: [f for f in files if f in present] for q, (_s, _d, files) in _TRAFFIC.items()})
        plan.errors = {e: f"counters/{e}" for e in ERROR_COUNTERS if f"counters/{e}" in present}
        plan.link_layer = (self._read(os.path.join(pdir, "link_layer")) or "").strip() or None
        return plan

    def _total(self, key: tuple, raw: int, modulus: int | None) -> int:
        total, status = self._counters.update(key, raw, modulus)
        if status == "wrap":
            self.wraps += 1
        elif status == "reset":
            self.resets += 1
            self.partial_errors += 1
        return total

    def _traffic(self, plan: _Plan, quantity: str) -> tuple[int, str] | None:
        """(raw value, file used) of one quantity; settles on one file once the choice is clear."""
        chosen = plan.chosen.get(quantity)
        candidates = [chosen] if chosen else [f for f in plan.traffic[quantity] if f not in plan.dead]
        raws = [self._counter(plan, f) for f in candidates]
        raw = pick(raws)
        if raw is None:
            return None
        used = candidates[raws.index(raw)]
        if not chosen and (len(candidates) == 1 or raw > 0):
            plan.chosen[quantity] = used
        return raw, used

    def read(self) -> list[Reading]:
        out: list[Reading] = []
        seen = []
        for dev, port in self.ports():
            plan = self._plans.get((dev, port))
            if plan is None or plan.stale:
                plan = self._plan(dev, port)
                if plan is None:
                    continue
                self._plans[(dev, port)] = plan
            attrs = {names.HW_ID: f"{dev}/{port}", names.HW_TYPE: "network",
                     names.IB_DEVICE: dev, names.IB_PORT: port}
            info = {"device": dev, "port": port, "link_layer": plan.link_layer}
            state_text = self._read(os.path.join(plan.pdir, "state"))
            state = parse_state(state_text) if state_text else None
            if state is not None:
                out.append(Reading(names.IB_UP, 1.0 if state[1] == "ACTIVE" else 0.0, attrs))
                info["state"] = state_text.strip()
            rate_text = self._read(os.path.join(plan.pdir, "rate"))
            rate = parse_rate(rate_text) if rate_text else None
            if rate is not None:
                out.append(Reading(names.NET_LIMIT, rate, attrs))
                info["rate"] = rate_text.strip()
            used = []
            for quantity, (spec, direction, _files) in _TRAFFIC.items():
                got = self._traffic(plan, quantity)
                if got is None:
                    continue
                raw, f = got
                used.append(f)
                total = self._total((dev, port, quantity), raw, MOD32 if f.startswith("counters/") else None)
                scale = WORD if spec is names.IB_IO else 1
                out.append(Reading(spec, float(total * scale), {**attrs, names.DIRECTION: direction}))
            for err, f in list(plan.errors.items()):
                raw = self._counter(plan, f)
                if raw is None:
                    plan.errors.pop(err)
                    continue
                total = self._total((dev, port, err), raw, None)
                out.append(Reading(names.IB_ERRORS, float(total), {**attrs, names.ERROR_TYPE: err}))
                used.append(f)
            info["counters"] = used
            seen.append(info)
        self._ports = seen
        present = {(i["device"], i["port"]) for i in seen}
        for gone in set(self._plans) - present:
            del self._plans[gone]
        return out

    def describe(self) -> dict:
        if not self._ports:
            try:
                self.read()
            except SourceError as e:
                return {"ports": [], "unreadable": [str(e)]}
        return {
            "root": self.base,
            "ports": self._ports,
            "counter_wraps": self.wraps,
            "counter_resets": self.resets,
            "saturated": sorted(self._saturated),
            "unreadable": sorted(self._no_pma) + [f"{p}: {w}" for p, w in sorted(self._unreadable.items())],
        }


def _num(port: str) -> tuple[int, str]:
    return (int(port), "") if port.isdigit() else (1 << 30, port)
