"""The PromQL behind a diagnosis window: few queries, aggregated on the server (pure builders).

Each builder returns one expression that unions several statistics (`a or b or ...`), every
part tagged by a `q` label (`label_replace`), so a whole family of numbers costs one request.
Unit-1 gauges are selected under both Prometheus forms (`hw_gpu_utilization_ratio` from the
OTLP translation, `hw_gpu_utilization` from the agent's scrape endpoint) with one regex.
"""
from __future__ import annotations

from .. import names as N
from ..readings import MetricSpec
from .health import health_parts
from .model import RECENT_S
from .work import peak_part, work_parts

Q = "otelgpu_q"   # the tag label; never a real label of ours
THROTTLE_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake")
TIMELINE_PHASES = ("checkpoint", "eval", "data_wait")
# loopback and virtual interfaces (and series without an interface: InfiniBand ports) left out
VIRTUAL_IFACES = "!~|lo|docker.*|veth.*|virbr.*|br-.*|cni.*|flannel.*"

GPU_BY = "host_name, hw_id, otelgpu_gpu_index"
RANK_BY = "host_name, otelgpu_rank"
NODE_BY = "host_name"


def label(key: str) -> str:
    """An attribute key as a Prometheus label (`host.name` -> `host_name`)."""
    return key.replace(".", "_")


def prom_names(spec: MetricSpec) -> list[str]:
    """The Prometheus names a spec may have: OTLP form first, then the scrape-endpoint form."""
    forms = [spec.prometheus_name(), spec.prometheus_name(unit_suffix=False)]
    return list(dict.fromkeys(forms))


def quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex_quote(value: str) -> str:
    """A literal for use inside a `=~` matcher."""
    special = set(".^$*+?()[]{}|\\")
    return "".join("\\" + c if c in special else c for c in value)


def selector(spec: MetricSpec | str, base: str, suffix: str = "", **matchers: str) -> str:
    """`name{base, k="v"}`; `base` is a ready matcher list (`otelgpu_job="x"`); values starting
    with `~` or `!~` / `!=` are regex / negated matchers."""
    parts = [base] if base else []
    for k, v in matchers.items():
        op = "="
        for prefix in ("!~", "!=", "~"):
            if v.startswith(prefix):
                op, v = ("=~" if prefix == "~" else prefix), v[len(prefix):]
                break
        parts.append(f"{k}{op}{quote(v)}")
    if isinstance(spec, str):
        return f"{spec}{suffix}{{{', '.join(parts)}}}"
    forms = [n + suffix for n in prom_names(spec)]
    if len(forms) == 1:
        return f"{forms[0]}{{{', '.join(parts)}}}"
    name = "|".join(regex_quote(f) for f in forms)
    return f"{{{', '.join([f'__name__=~{quote(name)}', *parts])}}}"


def job_matcher(job: str | None) -> str:
    return f"otelgpu_job={quote(job)}" if job else ""


def hosts_matcher(hosts: list[str]) -> str:
    return "host_name=~" + quote("|".join(regex_quote(h) for h in sorted(set(hosts))))


def union(parts: dict[str, str]) -> str:
    """`label_replace(e1, "otelgpu_q", "k1", "", "") or ...`; a `$1` in a key takes a label value
    (key "phase:otelgpu_phase" tags with the phase label)."""
    out = []
    for key, expr in parts.items():
        if ":" in key:
            prefix, src = key.split(":", 1)
            out.append(f'label_replace({expr}, "{Q}", "{prefix}_$1", "{src}", "(.*)")')
        else:
            out.append(f'label_replace({expr}, "{Q}", "{key}", "", "")')
    return " or ".join(out)


def dur(seconds: float) -> str:
    """A PromQL duration: whole seconds, else milliseconds (at least 1 ms)."""
    ms = max(1, int(round(seconds * 1000)))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def delta(sel: str, w: str) -> str:
    """Increase of a counter over the window without extrapolation: the last value minus the value
    at the window start, or the last value when the series started inside the window."""
    return f"(last_over_time({sel}[{w}]) - {sel} offset {w}) or last_over_time({sel}[{w}])"


def first_time(expr: str, W: str, R: str) -> str:
    """The first subquery step (every R) at which `expr` has a point: within R after its first sample.
    (`time() + 0 * x` instead of `timestamp(x)`, which Prometheus 2.x evaluates slowly in subqueries.)"""
    return f"min_over_time((time() + 0 * {expr})[{W}:{R}])"


def rank_summary(job_sel: str, w: float, res: float) -> str:
    """Per rank (host_name, otelgpu_rank): the last value of the step, step-time and phase counters and
    their value at the window start (one range scan each); points; the step counter's first time
    (within `res`) and last time (its last point when alive at the window's end, else when it
    reached its last value: subquery steps are aligned, so this may be missing); the time counted at
    the first point (step time plus checkpoint/eval phases), at the same subquery step as the first time;
    what a stall is judged on: the last values of the latest-step time, the open host wait per kind and
    the Flight Recorder sequence numbers per process group, and the checkpoint/eval seconds (own time
    and waits) counted in the window's last RECENT_S."""
    W, R = dur(w), dur(res)
    steps = selector(N.TRAIN_STEPS.prometheus_name(), job_sel)
    hist = N.TRAIN_STEP_DURATION.prometheus_name()
    phase = selector(N.TRAIN_PHASE_TIME.prometheus_name(), job_sel)
    between = selector(N.TRAIN_PHASE_TIME.prometheus_name(), job_sel, otelgpu_phase="~checkpoint|eval")
    by = f"by ({RANK_BY})"
    st = f"max {by} ({steps})"
    counted = f"sum {by} ({selector(hist, job_sel, '_sum')})"
    last = lambda sel: f"last_over_time({sel}[{W}])"   # noqa: E731
    coll = selector(N.TRAIN_COLLECTIVE_TIME.prometheus_name(), job_sel)
    # by kind: the waits of `collective_s`, eval's left out (never step time), so the kinds add up to the total
    steps_coll = selector(N.TRAIN_COLLECTIVE_TIME.prometheus_name(), job_sel,
                          otelgpu_phase="!~" + "|".join(N.OUTSIDE_STEPS))
    fetch = selector(N.TRAIN_COLLECTIVE_TIME.prometheus_name(), job_sel, otelgpu_collective=N.PARAM_GATHER[0],
                     otelgpu_phase="~" + "|".join(N.PARAM_GATHER[1]))
    unmeasured = selector(N.TRAIN_COLLECTIVE_UNMEASURED.prometheus_name(), job_sel)
    ckpt_end = selector(N.TRAIN_CHECKPOINTS.prometheus_name(), job_sel, otelgpu_checkpoint_event="end")
    seq = N.TRAIN_COLLECTIVE_SEQ.prometheus_name()
    recent = dur(min(RECENT_S, w))
    outside_coll = selector(N.TRAIN_COLLECTIVE_TIME.prometheus_name(), job_sel, otelgpu_phase="~checkpoint|eval")
    return union({
        # counter increase = last value - value at the window start (absent: started inside), in Python
        "steps": f"sum {by} ({last(steps)})",
        "steps0": f"sum {by} ({steps} offset {W})",
        "step_sum": f"sum {by} ({last(selector(hist, job_sel, '_sum'))})",
        "step_sum0": f"sum {by} ({selector(hist, job_sel, '_sum')} offset {W})",
        "step_count": f"sum {by} ({last(selector(hist, job_sel, '_count'))})",
        "step_count0": f"sum {by} ({selector(hist, job_sel, '_count')} offset {W})",
        "phase:otelgpu_phase": f"sum by ({RANK_BY}, otelgpu_phase) ({last(phase)})",
        "phase0:otelgpu_phase": f"sum by ({RANK_BY}, otelgpu_phase) ({phase} offset {W})",
        # seconds blocked in collectives, by the phase they happened in ('' outside phases) and by kind (outside eval)
        "coll:otelgpu_phase": f"sum by ({RANK_BY}, otelgpu_phase) ({last(coll)})",
        "coll0:otelgpu_phase": f"sum by ({RANK_BY}, otelgpu_phase) ({coll} offset {W})",
        "collkind:otelgpu_collective": f"sum by ({RANK_BY}, otelgpu_collective) ({last(steps_coll)})",
        "collkind0:otelgpu_collective": f"sum by ({RANK_BY}, otelgpu_collective) ({steps_coll} offset {W})",
        # all-gathers inside forward/backward: a sharded model's parameter fetch (ZeRO-3), not a batch's token count
        "fetch": f"sum {by} ({last(fetch)})",
        "fetch0": f"sum {by} ({fetch} offset {W})",
        # which basis the rank's collective time has (host-blocked or GPU-timed: never summed together)
        "collbasis:otelgpu_collective_basis": f"sum by ({RANK_BY}, otelgpu_collective_basis) ({last(coll)})",
        # collectives not measured, by reason (a process-wide reason is 1 from the start: last value)
        "collun:otelgpu_collective_unmeasured_reason": f"sum by ({RANK_BY}, otelgpu_collective_unmeasured_reason) "
                                                       f"({last(unmeasured)})",
        "saves": f"sum {by} ({last(ckpt_end)})",
        "saves0": f"sum {by} ({ckpt_end} offset {W})",
        "n": f"max {by} (count_over_time({steps}[{W}]))",
        "t0": first_time(st, W, R),
        "t1": f"max {by} (timestamp({steps}))",   # exact while the series is alive at the window's end
        "t1m": first_time(f"({st} == max {by} (last_over_time({steps}[{W}] @ end())))", W, R),
        "first_sum": f"min_over_time((({counted} + sum {by} ({between})) or {counted})[{W}:{R}])",
        # a stall: when the last step ended, who is inside a host wait (per kind), how far each process group got
        "steplast": f"max {by} ({last(selector(N.TRAIN_STEP_LAST.prometheus_name(), job_sel))})",
        "open:otelgpu_collective": f"max by ({RANK_BY}, otelgpu_collective) "
                                   f"({last(selector(N.TRAIN_COLLECTIVE_OPEN.prometheus_name(), job_sel))})",
        "seqs:otelgpu_process_group": f"max by ({RANK_BY}, otelgpu_process_group) "
                                      f"({last(selector(seq, job_sel, otelgpu_collective_state='started'))})",
        "seqc:otelgpu_process_group": f"max by ({RANK_BY}, otelgpu_process_group) "
                                      f"({last(selector(seq, job_sel, otelgpu_collective_state='completed'))})",
        "recent_ph": f"sum {by} ({delta(between, recent)})",
        "recent_co": f"sum {by} ({delta(outside_coll, recent)})",
        **work_parts(job_sel, W, selector),   # model FLOPs, tokens, compute dtype (diagnose/work.py)
        **health_parts(job_sel, W, selector),   # GC time, CUDA allocator (diagnose/health.py)
    })


def gpu_summary(agent_sel: str, w: float, res: float) -> str:
    """Per GPU (host_name, hw_id, otelgpu_gpu_index): means (utilization, GPM SM, tensor, DRAM and
    occupancy), peaks, throttle shares, points, first time (within `res`) and last time (when alive
    at the end), ranks on it. `fetch_window` evaluates it over the training time."""
    W, R = dur(w), dur(res)
    mem = selector(N.GPU_MEMORY_USAGE, agent_sel)
    clock = selector(N.GPU_CLOCK, agent_sel, otelgpu_clock_domain="sm")
    reasons = selector(N.GPU_CLOCK_EVENT, agent_sel, otelgpu_clock_event_reason="~" + "|".join(THROTTLE_REASONS))
    g = f"by ({GPU_BY})"
    return union({
        "util": f"avg {g} (avg_over_time({selector(N.GPU_UTILIZATION, agent_sel)}[{W}]))",
        "sm": f"avg {g} (avg_over_time({selector(N.GPU_SM_ACTIVITY, agent_sel)}[{W}]))",
        "tensor": f"avg {g} (avg_over_time({selector(N.GPU_TENSOR_ACTIVITY, agent_sel)}[{W}]))",
        "dram": f"avg {g} (avg_over_time({selector(N.GPU_DRAM_ACTIVITY, agent_sel)}[{W}]))",
        "occupancy": f"avg {g} (avg_over_time({selector(N.GPU_SM_OCCUPANCY, agent_sel)}[{W}]))",
        "power": f"avg {g} (avg_over_time({selector(N.GPU_POWER, agent_sel)}[{W}]))",
        "power_limit": f"max {g} (max_over_time({selector(N.GPU_POWER_LIMIT, agent_sel)}[{W}]))",
        "temp": f"avg {g} (avg_over_time({selector(N.GPU_TEMPERATURE, agent_sel)}[{W}]))",
        "temp_max": f"max {g} (max_over_time({selector(N.GPU_TEMPERATURE, agent_sel)}[{W}]))",
        "clock": f"avg {g} (avg_over_time({clock}[{W}]))",
        "clock_max": f"max {g} (max_over_time({clock}[{W}]))",
        "mem_used": f"max {g} (max_over_time({mem}[{W}]))",
        "mem_limit": f"max {g} (max_over_time({selector(N.GPU_MEMORY_LIMIT, agent_sel)}[{W}]))",
        "throttle:otelgpu_clock_event_reason": f"avg by ({GPU_BY}, otelgpu_clock_event_reason) (avg_over_time({reasons}[{W}]))",
        "rank:otelgpu_rank": f"max by ({GPU_BY}, otelgpu_rank) (max_over_time({selector(N.GPU_PROCESS_MEMORY, agent_sel)}[{W}]))",
        "model:hw_name": f"max by ({GPU_BY}, hw_name) (max_over_time({mem}[{W}]))",   # consistency.py
        "pcie_gen": f"max {g} (max_over_time({selector(N.GPU_PCIE_LINK_GENERATION, agent_sel)}[{W}]))",
        "pcie_width": f"max {g} (max_over_time({selector(N.GPU_PCIE_LINK_WIDTH, agent_sel)}[{W}]))",
        "clock_limit": f"max {g} (max_over_time({selector(N.GPU_CLOCK_LIMIT, agent_sel, otelgpu_clock_domain='sm')}[{W}]))",
        "driver:otelgpu_driver_version": f"max by ({GPU_BY}, otelgpu_driver_version) "
                                         f"(max_over_time({selector(N.GPU_DRIVER, agent_sel)}[{W}]))",
        **peak_part(agent_sel, W, selector, GPU_BY),   # dense peaks per dtype (diagnose/work.py)
        "n": f"max {g} (count_over_time({mem}[{W}]))",
        "t0": first_time(f"max {g} ({mem})", W, R),
        "t1": f"max {g} (timestamp({mem}))",   # exact while the series is alive at the window's end
    })


def node_summary(agent_sel: str, w: float) -> str:
    """Per node (host_name): CPU, memory and swap, NIC/IB errors and throughput vs link, disk writes."""
    W = dur(w)
    h = f"by ({NODE_BY})"
    ib_io = selector(N.IB_IO, agent_sel)
    eth_io = selector(N.NET_IO, agent_sel, network_interface_name=VIRTUAL_IFACES)
    limit = N.NET_LIMIT
    return union({
        "cpu_busy": f"1 - avg {h} (avg_over_time({selector(N.CPU_UTILIZATION, agent_sel, cpu_mode='idle')}[{W}]))",
        "mem_used": f"max {h} (max_over_time({selector(N.MEMORY_UTILIZATION, agent_sel)}[{W}]))",
        "swap_used": f"max {h} (max_over_time({selector(N.PAGING_USAGE, agent_sel, system_paging_state='used')}[{W}]))",
        "swap_rate": f"sum {h} (rate({selector(N.PAGING_OPERATIONS, agent_sel)}[{W}]))",
        "nic_errors": f"sum {h} ({delta(selector(N.NET_ERRORS, agent_sel), W)})",
        "ib_errors": f"sum {h} ({delta(selector(N.IB_ERRORS, agent_sel), W)})",
        "ib_rate": f"max {h} (sum by ({NODE_BY}, network_io_direction) (rate({ib_io}[{W}])))",
        "ib_limit": f"sum {h} (max by ({NODE_BY}, otelgpu_ib_device, otelgpu_ib_port) (max_over_time({selector(limit, agent_sel, otelgpu_ib_device='~.+')}[{W}])))",
        "eth_rate": f"max {h} (sum by ({NODE_BY}, network_io_direction) (rate({eth_io}[{W}])))",
        "eth_limit": f"sum {h} (max by ({NODE_BY}, network_interface_name) (max_over_time({selector(limit, agent_sel, network_interface_name=VIRTUAL_IFACES)}[{W}])))",
        "disk_write": f"sum {h} (rate({selector(N.DISK_IO, agent_sel, disk_io_direction='write')}[{W}]))",
        # the processes the agent reads (the job's: on a GPU, started by them, or below `otel-gpu run`):
        # their summed CPU at each reading, averaged over the window (in CPUs)
        "job_cpu": f"sum {h} (sum_over_time({selector(N.PROCESS_CPU_UTILIZATION, agent_sel)}[{W}])) / "
                   f"max {h} (count_over_time({selector(N.PROCESS_CPU_UTILIZATION, agent_sel)}[{W}]))",
        "cpus": f"max {h} (max_over_time({selector(N.CPU_COUNT, agent_sel)}[{W}]))",
    })


def timeline(job_sel: str, agent_sel: str, smooth: float) -> str:
    """Job-wide series over time (range query): GPU activity, step rate, cumulative phase seconds
    (a phase counter moves only when a phase ends: occupancy is rebuilt from its increments, see
    `window.occupancy`), disk writes, peak node interconnect rate. `smooth` is the averaging range in
    seconds: at least a grid step plus two export intervals, so consecutive ranges overlap."""
    S = dur(smooth)
    phases = selector(N.TRAIN_PHASE_TIME.prometheus_name(), job_sel, otelgpu_phase="~" + "|".join(TIMELINE_PHASES))
    return union({
        "util": f"avg(avg_over_time({selector(N.GPU_UTILIZATION, agent_sel)}[{S}]))",
        "sm": f"avg(avg_over_time({selector(N.GPU_SM_ACTIVITY, agent_sel)}[{S}]))",
        "steps": f"sum(rate({selector(N.TRAIN_STEPS.prometheus_name(), job_sel)}[{S}]))",
        "phasecum:otelgpu_phase": f"sum by (otelgpu_phase) ({phases})",
        "disk_write": f"sum(rate({selector(N.DISK_IO, agent_sel, disk_io_direction='write')}[{S}]))",
        "ib": f"max(sum by ({NODE_BY}) (rate({selector(N.IB_IO, agent_sel)}[{S}])))",
    })


def checkpoint_times(job_sel: str, w: float) -> str:
    """Every sample of the ranks' latest-save start/end times in the window (a range vector: one
    distinct value per save seen)."""
    return f"{selector(N.TRAIN_CHECKPOINT_LAST.prometheus_name(), job_sel)}[{dur(w)}]"


def rank_busy(job_sel: str, smooth: float) -> str:
    """Per rank over time (range query): the increase, over `smooth` seconds, of step time, steps, seconds
    blocked in collectives (in any phase: phase seconds are own time) and checkpoint/eval phase seconds, from which
    `window.parse_busy` makes busy seconds per step at each point."""
    S = dur(smooth)
    by = f"by ({RANK_BY})"
    hist = N.TRAIN_STEP_DURATION.prometheus_name()
    not_steps = "|".join(N.OUTSIDE_STEPS)   # eval: neither its time nor its waits are in any step
    coll = selector(N.TRAIN_COLLECTIVE_TIME.prometheus_name(), job_sel, otelgpu_phase=f"!~{not_steps}")   # phases are own time: every other wait
    outside = selector(N.TRAIN_PHASE_TIME.prometheus_name(), job_sel, otelgpu_phase="checkpoint")
    return union({
        "bsum": f"sum {by} (increase({selector(hist, job_sel, '_sum')}[{S}]))",
        "bcount": f"sum {by} (increase({selector(hist, job_sel, '_count')}[{S}]))",
        "bcoll": f"sum {by} (increase({coll}[{S}]))",
        "bout": f"sum {by} (increase({outside}[{S}]))",
    })
