"""The PromQL of the rules (pure builders), on the Prometheus names of `otel_gpu.names`.

Series of the OTLP path carry no staleness markers: a process that stopped exporting leaves its
last sample visible for Prometheus' 5-minute lookback. So "alive" is said explicitly, from sample
times: a job still runs while the newest sample of its ranks is younger than `fresh_s`; a rank is
gone when its newest sample is `stall.gone_s` older than its job's newest (`fresh(x)`: the series
of `x` younger than `fresh_s`, for the agent). Per rank the identity is (otelgpu_job, otelgpu_rank,
host_name); per GPU (host_name, hw_id, otelgpu_gpu_index).
"""
from __future__ import annotations

from .. import names as N
from ..diagnose.queries import quote, selector
from .params import MIN_STEPS, duration

J, R, H = "otelgpu_job", "otelgpu_rank", "host_name"
RANK = f"{J}, {R}, {H}"
BASIS = "otelgpu_collective_basis"
GPU = f"{J}, {H}, hw_id, otelgpu_gpu_index"   # the agent puts otelgpu_job on its series when it knows the job
PHASE_LABEL = "otelgpu_phase"

STEPS = N.TRAIN_STEPS.prometheus_name()
HIST = N.TRAIN_STEP_DURATION.prometheus_name()
PHASE = N.TRAIN_PHASE_TIME.prometheus_name()
COLL = N.TRAIN_COLLECTIVE_TIME.prometheus_name()
UNMEASURED = N.TRAIN_COLLECTIVE_UNMEASURED.prometheus_name()
ERRORS = N.GPU_ERRORS.prometheus_name()
CLOCK_EVENT = N.GPU_CLOCK_EVENT.prometheus_name()
PROCESS_MEMORY = N.GPU_PROCESS_MEMORY.prometheus_name()
AGENT_SAMPLES = N.SAMPLES.prometheus_name()
STEP_LAST = N.TRAIN_STEP_LAST.prometheus_name()
COLLECTIVE_OPEN = N.TRAIN_COLLECTIVE_OPEN.prometheus_name()
COLLECTIVE_SEQ = N.TRAIN_COLLECTIVE_SEQ.prometheus_name()
PG = "otelgpu_process_group"
HOLDER = "otelgpu_holder"   # why a rank is named as holding a stalled job

# recorded series
STEPS_RATE = "otelgpu_rank:steps:rate"
STEP_MEAN = "otelgpu_rank:step_seconds:mean"
BUSY = "otelgpu_rank:busy_seconds_per_step:mean"
LATENESS = "otelgpu_rank:lateness_seconds_per_step:mean"
PHASE_SHARE = "otelgpu_rank:phase_share:rate"
PERIODIC_SHARE = "otelgpu_rank:phase_share:rate_long"
REPORTING = "otelgpu_rank:reporting:timestamp"
GONE = "otelgpu_rank:gone"
NEWEST_AGE = "otelgpu_job:newest_sample_age_seconds"
OPEN_MAX = "otelgpu_rank:collective_open_seconds:max"
SEQ_STARTED = "otelgpu_rank:collective_started_seq:max"
OUTSIDE = "otelgpu_rank:outside_steps_share:rate1m"
SINCE_STEP = "otelgpu_job:seconds_since_step"
STALL_AFTER = "otelgpu_job:stall_threshold_seconds"

# counted reasons add one per unmeasured collective; the others are 1 for a whole unmeasured process
COUNTED_REASONS = ("timing_off", "ring_overflow")
POWER_REASONS = ("sw_power_cap",)
SLOWDOWN_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake")


def rate(sel: str, w: float, by: str = RANK) -> str:
    return f"sum by ({by}) (rate({sel}[{duration(w)}]))"


def fresh(sel: str, fresh_s: float) -> str:
    """`sel` where its newest sample is younger than `fresh_s` (the process still exports)."""
    return f"({sel} unless (time() - timestamp({sel}) > {fresh_s:g}))"


# ---- per rank ------------------------------------------------------------------------------------
def steps_rate(w: float) -> str:
    """Steps per second of each rank."""
    return rate(STEPS, w)


def step_mean(w: float) -> str:
    """Mean step time of each rank (s)."""
    return f"{rate(HIST + '_sum', w)}\n/\n{rate(HIST + '_count', w)}"


def busy(w: float, basis: str) -> str:
    """Seconds per step each rank was not waiting for its peers, as the diagnosis counts them: step time
    minus collective waits (outside eval, which is never step time) minus checkpoint time, over steps.
    `basis`: "host" (gloo, and series older than the basis label) or "gpu" (NCCL); never mixed."""
    coll = selector(COLL, "", otelgpu_phase="!=eval",
                    **{BASIS: "!=gpu" if basis == "host" else "gpu"})
    step_sum = rate(HIST + "_sum", w)
    ckpt = rate(selector(PHASE, "", otelgpu_phase="checkpoint"), w)
    return (f"(\n  {step_sum}\n  - {rate(coll, w)}\n  - ({ckpt} or 0 * {step_sum})\n)\n"
            f"/\n{rate(HIST + '_count', w)}")


def lateness() -> str:
    """Busy time per step over the mean of the other ranks' of the job on the same basis (s); ranks of
    jobs with at least two ranks measured."""
    by = f"{J}, {BASIS}"
    others = (f"(sum by ({by}) ({BUSY}) - on({by}) group_right() {BUSY})\n"
              f"  / on({by}) group_left()\n  ((count by ({by}) ({BUSY}) > 1) - 1)")
    return f"{BUSY}\n-\n(\n  {others}\n)"


def phase_share(w: float) -> str:
    """Share of wall time each rank spent in each phase (the phase's own time)."""
    return rate(PHASE, w, f"{RANK}, {PHASE_LABEL}")


def periodic_share(w: float) -> str:
    """Checkpoint and eval share of wall time per rank: the phase's own time plus the collective waits
    inside it (a sharded save's gathers), as the diagnosis counts them."""
    by = f"{RANK}, {PHASE_LABEL}"
    own = rate(selector(PHASE, "", otelgpu_phase="~checkpoint|eval"), w, by)
    waits = rate(selector(COLL, "", otelgpu_phase="~checkpoint|eval"), w, by)
    return f"{own}\n+\n({waits} or 0 * {own})"


# ---- liveness and stall -------------------------------------------------------------------------------
def reporting(gone_s: float) -> str:
    """Ranks whose newest sample is within `gone_s` of the newest of their job's (value: its time)."""
    return (f"max by ({RANK}) (timestamp({STEPS}))\n"
            f">= on({J}) group_left()\n(max by ({J}) (timestamp({STEPS})) - {gone_s:g})")


def gone(lookback_s: float) -> str:
    """Ranks seen within the lookback that no longer report (on any node)."""
    return (f"max by ({RANK}) (last_over_time({STEPS}[{duration(lookback_s)}]))\n"
            f"unless on({J}, {R}) {REPORTING}")


def newest_age() -> str:
    """Seconds since the newest sample of any rank of the job (a job that ended ages past `fresh`)."""
    return f"time() - max by ({J}) (timestamp({STEPS}))"


def since_step(fresh_s: float) -> str:
    """Seconds since the latest step of the job's ranks, for jobs whose ranks still report."""
    return f"time() - max by ({J}) ({STEP_LAST})\nand on({J}) ({NEWEST_AGE} < {fresh_s:g})"


def stall_after(k: float, floor_s: float) -> str:
    """max(K x the job's median step, T) (s), as the diagnosis: the median over the job's ranks of each
    rank's typical step, the longer of its mean step in the rate window and since it started; T alone
    before a step time is known."""
    life = f"sum by ({RANK}) ({HIST}_sum) / sum by ({RANK}) ({HIST}_count)"
    recent = f"({STEP_MEAN} > 0)"   # no step in the window: 0/0, left out
    typical = f"({life} >= on({RANK}) {recent})\n    or on({RANK}) {recent}\n    or on({RANK}) {life}"
    median = f"quantile by ({J}) (0.5,\n    {typical}\n  )"
    return f"clamp_min(\n  {k:g} * {median},\n  {floor_s:g}\n)\nor on({J})\n(0 * {SINCE_STEP} + {floor_s:g})"


def open_max() -> str:
    """Seconds each reporting rank has been blocked in its current host-timed collective (0: none)."""
    return f"max by ({RANK}) ({COLLECTIVE_OPEN})\nand on({J}, {R}) {REPORTING}"


def started_seq() -> str:
    """The last NCCL collective sequence number each reporting rank started, per process group."""
    sel = selector(COLLECTIVE_SEQ, "", otelgpu_collective_state="started")
    return f"max by ({RANK}, {PG}) ({sel})\nand on({J}, {R}) {REPORTING}"


def outside_steps() -> str:
    """Share of the last minute each reporting rank spent in checkpoint or eval (own time and waits inside)."""
    by = RANK
    own = rate(selector(PHASE, "", otelgpu_phase="~checkpoint|eval"), 60, by)
    waits = rate(selector(COLL, "", otelgpu_phase="~checkpoint|eval"), 60, by)
    return f"(\n  {own}\n  + ({waits} or 0 * {own})\n)\nor on({RANK}) 0 * {REPORTING}"


def stalled(wait_share: float, outside_share: float) -> str:
    """Jobs with no step for longer than their threshold (not all saving or evaluating), with the rank(s)
    holding them when known, each tagged by `otelgpu_holder` with why: `not_waiting`, a reporting rank
    not inside a host-timed collective while another waits in one for `wait_share` of the stall (gloo);
    `behind`, a rank behind the others' started NCCL sequence number on a process group; `gone`, a rank
    that stopped reporting. The value is the seconds since the job's latest step."""
    late = (f"({SINCE_STEP} > on({J}) {STALL_AFTER}\n"
            f"   unless on({J}) (min by ({J}) ({OUTSIDE}) >= {outside_share:g}))")
    waited = f"({wait_share:g} * {SINCE_STEP})"
    not_waiting = (f"{OPEN_MAX} < on({J}) group_left() {waited}\n"
                   f"        and on({J}) (max by ({J}) ({OPEN_MAX}) >= on({J}) {waited})")
    behind = (f"max by ({RANK}) ({SEQ_STARTED} < on({J}, {PG}) group_left() "
              f"max by ({J}, {PG}) ({SEQ_STARTED}))")
    holders = f"\n      or on({RANK})\n      ".join(
        f'label_replace(\n        {expr},\n        "{HOLDER}", "{tag}", "", "")'
        for tag, expr in (("not_waiting", not_waiting), ("behind", behind), ("gone", GONE)))
    return (f"{late}\n  * on({J}) group_right()\n  (\n    (\n      {holders}\n    ) * 0 + 1\n  )\n"
            f"or on({J})\n{late}")


# ---- alerts' conditions -------------------------------------------------------------------------------
def straggler(share: float, min_s: float, window_s: float) -> str:
    """The busiest rank of its job (and basis) when it is `share` of the job's mean step (and `min_s`)
    busier than the others' mean; value: that share."""
    by = f"{J}, {BASIS}"
    return (f"{LATENESS} / on({J}) group_left() avg by ({J}) ({STEP_MEAN}) >= {share:g}\n"
            f"and {LATENESS} >= {min_s:g}\n"
            f"and ({BUSY} == on({by}) group_left() max by ({by}) ({BUSY}))\n"
            f"and on({RANK}) ({STEPS_RATE} * {window_s:g} >= {MIN_STEPS})")


def input_bound(share: float) -> str:
    """The least data_wait share of the job's ranks (what every rank pays; 0 for a rank without the phase)."""
    dw = f'{PHASE_SHARE}{{{PHASE_LABEL}="data_wait"}}'
    return (f"min by ({J}) (\n  {dw}\n  or on({RANK}) (0 * {STEPS_RATE})\n) >= {share:g}\n"
            f"and on({J}) (sum by ({J}) ({STEPS_RATE}) > 0)")


def periodic(phase: str, share: float) -> str:
    """The largest share of a periodic phase over the job's ranks."""
    return f'max by ({J}) ({PERIODIC_SHARE}{{{PHASE_LABEL}="{phase}"}}) >= {share:g}'


def hw_errors(kind: str, w: float) -> str:
    """GPU error counts that grew in the window. XID series appear with their first event (the agent
    counts from its start), so a new one counts too; ECC totals since driver load can be non-zero at the
    agent's start, so only their increase counts."""
    by = f"{GPU}, error_type"
    sel = selector(ERRORS, "", error_type="~" + {"xid": "xid_.*", "uncorrected": "ecc_uncorrected",
                                                   "corrected": "ecc_corrected"}[kind])
    grew = f"sum by ({by}) (increase({sel}[{duration(w)}])) > 0"
    if kind != "xid":
        return grew
    return f"{grew}\nor\n(max by ({by}) ({sel}) unless max by ({by}) ({sel} offset {duration(w)}))"


def row_remap(state: str) -> str:
    """GPUs whose memory row remapping is `state` ("pending": applied at the next GPU reset; "failed":
    the GPU needs service); the agent reads the flags every 10 s where the GPU reports them."""
    spec = {"pending": N.GPU_ROW_REMAP_PENDING, "failed": N.GPU_ROW_REMAP_FAILED}[state]
    return f"max by ({GPU}) ({selector(spec, '')}) > 0"


def throttled(reasons: tuple[str, ...], share: float, w: float) -> str:
    """A clock-event reason active at least `share` of the window on a GPU whose node has ranks stepping."""
    sel = selector(CLOCK_EVENT, "", otelgpu_clock_event_reason="~" + "|".join(reasons))
    return (f"max by ({GPU}, otelgpu_clock_event_reason) (avg_over_time({sel}[{duration(w)}])) >= {share:g}\n"
            f"and on({H}) (sum by ({H}) ({STEPS_RATE}) > 0)")


def gpu_idle(util_max: float, w: float) -> str:
    """GPUs a rank's process holds memory on, mean utilization below `util_max` while that rank steps;
    value: the utilization."""
    held = f"max by ({GPU}, {R}) ({selector(PROCESS_MEMORY, '', otelgpu_rank='!=')})"
    util = f"avg by ({H}, hw_id) (avg_over_time({selector(N.GPU_UTILIZATION, '')}[{duration(w)}]))"
    return (f"({held} * 0 + on({H}, hw_id) group_left() {util}) < {util_max:g}\n"
            f"and on({H}, {R}) ({STEPS_RATE} > 0)")


def agent_missing(fresh_s: float, lookback_s: float, scrape_job: str) -> str:
    """Nodes whose agent exported within the lookback but not now; agents scraped as `scrape_job` that are down."""
    seen = f"max by ({H}) (last_over_time({AGENT_SAMPLES}[{duration(lookback_s)}]))"
    return (f"{seen}\nunless on({H}) max by ({H}) ({fresh(AGENT_SAMPLES, fresh_s)})\n"
            f"or\nup{{job={quote(scrape_job)}}} == 0")


def rank_missing(fresh_s: float) -> str:
    """Ranks gone while other ranks of their job still report."""
    return f"{GONE}\nand on({J}) ({NEWEST_AGE} < {fresh_s:g})"


def unmeasured(w: float, fresh_s: float) -> str:
    """Collectives whose time was not measured: counted reasons that grew in the window, or a live
    process that is unmeasured as a whole."""
    by = f"{RANK}, otelgpu_collective_unmeasured_reason"
    counted = selector(UNMEASURED, "", otelgpu_collective_unmeasured_reason="~" + "|".join(COUNTED_REASONS))
    whole = selector(UNMEASURED, "", otelgpu_collective_unmeasured_reason="!~" + "|".join(COUNTED_REASONS))
    return (f"sum by ({by}) (increase({counted}[{duration(w)}])) > 0\n"
            f"or\nmax by ({by}) ({fresh(whole, fresh_s)}) > 0")
