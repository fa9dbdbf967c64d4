"""The rule groups (plain dicts, the Prometheus rule-file layout) from the thresholds and parameters.

Every alert carries `severity` (info, warning, critical) and `otelgpu_rule` (the diagnosis rule it
mirrors), the job, rank, node and GPU labels its expression keeps, a summary and a description
with the value, and a `runbook` line: the `otel-gpu diagnose` command that explains it. Where the
diagnosis grades a share as warning and critical, two rules of one alert name do the same; the
Alertmanager configuration inhibits the warning while the critical one fires.
"""
from __future__ import annotations

from ..diagnose.thresholds import Thresholds
from . import exprs as E
from .params import RuleParams, duration

# a job name as it may appear in a command line shown in a notification: other characters become _
SAFE_JOB = '{{ $labels.otelgpu_job | reReplaceAll "[^A-Za-z0-9._:@+=-]" "_" }}'
WHERE_RANK = "rank {{ $labels.otelgpu_rank }} on {{ $labels.host_name }}"
WHERE_GPU = "GPU {{ $labels.otelgpu_gpu_index }} ({{ $labels.hw_id }}) on {{ $labels.host_name }}"


def stall_numbers(th: Thresholds) -> tuple[float, float]:
    """(K, T): a job is stalled after max(K x its median step, T seconds) without a step."""
    return float(th["stall"]["step_factor"]), float(th["stall"]["min_s"])


def groups(th: Thresholds, p: RuleParams) -> list[dict]:
    """The rule groups: training (recording rules, then alerts), GPUs, agents."""
    return [_group("otel-gpu.training", _training_records(th, p) + _training_alerts(th, p), p),
            _group("otel-gpu.gpu", _gpu_alerts(th, p), p),
            _group("otel-gpu.targets", [_agent_missing(p)], p)]


def _group(name: str, rules: list[dict], p: RuleParams) -> dict:
    g = {"name": name}
    if p.interval_s is not None:
        g["interval"] = duration(p.interval_s)
    g["rules"] = rules
    return g


def _record(name: str, expr: str, **labels: str) -> dict:
    out = {"record": name, "expr": expr}
    if labels:
        out["labels"] = dict(labels)
    return out


def _alert(p: RuleParams, name: str, expr: str, severity: str, rule: str, summary: str, description: str,
           runbook: str) -> dict:
    return {"alert": name, "expr": expr, "for": duration(p.for_s[name]),
            "labels": {"severity": severity, "otelgpu_rule": rule},
            "annotations": {"summary": summary, "description": description, "runbook": runbook}}


def _job_runbook(p: RuleParams, last_s: float) -> str:
    return f"otel-gpu diagnose --prometheus {p.prometheus_url} --job {SAFE_JOB} --last {duration(max(last_s, 600))}"


def _node_runbook(p: RuleParams) -> str:
    return (f"otel-gpu diagnose --prometheus {p.prometheus_url} --gpu-only --last 1h"
            f"{{{{ if $labels.otelgpu_job }}}} --job {SAFE_JOB}{{{{ end }}}}")


def _training_records(th: Thresholds, p: RuleParams) -> list[dict]:
    k, floor = stall_numbers(th)
    w = p.window_s
    return [
        _record(E.STEPS_RATE, E.steps_rate(w)),
        _record(E.STEP_MEAN, E.step_mean(w)),
        _record(E.BUSY, E.busy(w, "host"), otelgpu_collective_basis="host"),
        _record(E.BUSY, E.busy(w, "gpu"), otelgpu_collective_basis="gpu"),
        _record(E.LATENESS, E.lateness()),
        _record(E.PHASE_SHARE, E.phase_share(w)),
        _record(E.PERIODIC_SHARE, E.periodic_share(p.periodic_window_s)),
        _record(E.REPORTING, E.reporting(th["stall"]["gone_s"])),
        _record(E.GONE, E.gone(p.lookback_s)),
        _record(E.NEWEST_AGE, E.newest_age()),
        _record(E.SINCE_STEP, E.since_step(p.fresh_s)),
        _record(E.STALL_AFTER, E.stall_after(k, floor)),
        _record(E.OPEN_MAX, E.open_max()),
        _record(E.SEQ_STARTED, E.started_seq()),
        _record(E.OUTSIDE, E.outside_steps()),
    ]


def _training_alerts(th: Thresholds, p: RuleParams) -> list[dict]:
    k, floor = stall_numbers(th)
    sev, st = th["severity"], th["straggler"]
    job_rb = _job_runbook(p, p.window_s)
    out = [_alert(
        p, "OtelGpuTrainingStalled", E.stalled(th["stall"]["wait_share"], th["stall"]["outside_share"]),
        "critical", "stall",
        "job {{ $labels.otelgpu_job }} stalled: no step for {{ $value | humanizeDuration }}"
        f"{{{{ if $labels.otelgpu_rank }}}}, held by {WHERE_RANK}{{{{ end }}}}",
        f"No rank of job {{{{ $labels.otelgpu_job }}}} completed a step for {{{{ $value | humanizeDuration }}}} while "
        f"the job still reports (threshold: max({k:g} x its median step, {floor:g} s)). "
        '{{ if eq $labels.otelgpu_holder "not_waiting" }}Rank {{ $labels.otelgpu_rank }} is not inside a collective '
        "while another rank has waited in one for at least "
        f"{th['stall']['wait_share']:.0%} of that."
        '{{ else if eq $labels.otelgpu_holder "behind" }}Rank {{ $labels.otelgpu_rank }} has not started the NCCL '
        "collective the others started."
        '{{ else if eq $labels.otelgpu_holder "gone" }}Rank {{ $labels.otelgpu_rank }} stopped reporting.'
        "{{ else }}No rank is named: none waits in a collective, or the collective gauges are not exported.{{ end }}",
        job_rb)]
    for severity, share in (("warning", max(st["lateness_share"], sev["warning_share"])),
                            ("critical", max(st["lateness_share"], sev["critical_share"]))):
        out.append(_alert(
            p, "OtelGpuStraggler", E.straggler(share, st["lateness_min_s"], p.window_s), severity, "straggler",
            f"{WHERE_RANK} is a straggler in job {{{{ $labels.otelgpu_job }}}}",
            f"{WHERE_RANK} is busy {{{{ $value | humanizePercentage }}}} of a step longer than the mean of the "
            f"other ranks of job {{{{ $labels.otelgpu_job }}}} (busy = step time minus time waiting in collectives, "
            f"{{{{ $labels.otelgpu_collective_basis }}}}-timed, over {duration(p.window_s)}): the others wait for it "
            f"in every collective.",
            job_rb))
    t = th["input"]
    for severity, share in (("warning", t["share_warning"]), ("critical", t["share_critical"])):
        out.append(_alert(
            p, "OtelGpuInputBound", E.input_bound(share), severity, "input",
            "job {{ $labels.otelgpu_job }} waits for input {{ $value | humanizePercentage }} of its time",
            f"Every rank of job {{{{ $labels.otelgpu_job }}}} spent at least {{{{ $value | humanizePercentage }}}} "
            f"of its wall time waiting for its next batch (data_wait) over {duration(p.window_s)}.",
            job_rb))
    for phase, name, rule, what in (("checkpoint", "OtelGpuCheckpointShare", "checkpoint", "saving checkpoints"),
                                    ("eval", "OtelGpuEvalShare", "eval", "evaluating")):
        t = th[rule]
        for severity, share in (("warning", t["share_warning"]), ("critical", t["share_critical"])):
            out.append(_alert(
                p, name, E.periodic(phase, share), severity, rule,
                f"job {{{{ $labels.otelgpu_job }}}} spends {{{{ $value | humanizePercentage }}}} of its time {what}",
                f"A rank of job {{{{ $labels.otelgpu_job }}}} spent {{{{ $value | humanizePercentage }}}} of its wall "
                f"time {what} over {duration(p.periodic_window_s)} (its own time and the collective waits inside); "
                f"synchronous training waits for it on every rank.",
                _job_runbook(p, p.periodic_window_s)))
    out.append(_alert(
        p, "OtelGpuRankMissing", E.rank_missing(p.fresh_s), "critical", "targets",
        f"{WHERE_RANK} of job {{{{ $labels.otelgpu_job }}}} stopped reporting",
        f"{WHERE_RANK} of job {{{{ $labels.otelgpu_job }}}} last reported more than "
        f"{duration(th['stall']['gone_s'])} before the newest report of the job's other ranks, which still report: "
        "the process died, hangs with its exporter, or cannot reach the collector.",
        job_rb))
    out.append(_alert(
        p, "OtelGpuCollectivesUnmeasured", E.unmeasured(p.window_s, p.fresh_s), "info", "straggler",
        f"{WHERE_RANK} of job {{{{ $labels.otelgpu_job }}}}: collective time not measured",
        f"{WHERE_RANK} of job {{{{ $labels.otelgpu_job }}}} could not time its collectives "
        "({{ $labels.otelgpu_collective_unmeasured_reason }}): the straggler alert cannot judge this rank.",
        job_rb))
    return out


def _gpu_alerts(th: Thresholds, p: RuleParams) -> list[dict]:
    rb = _node_runbook(p)
    out = []
    for kind, severity, what in (("xid", "warning", "XID events"), ("uncorrected", "critical", "uncorrected ECC errors"),
                                 ("corrected", "info", "corrected ECC errors")):
        out.append(_alert(
            p, "OtelGpuHardwareErrors", E.hw_errors(kind, p.error_window_s), severity, "hw_errors",
            f"{WHERE_GPU}: {what} ({{{{ $labels.error_type }}}})",
            f"{WHERE_GPU} reported {{{{ printf \"%.0f\" $value }}}} more {{{{ $labels.error_type }}}} in the last "
            f"{duration(p.error_window_s)} (XID: the agent's count since its start; ECC: volatile counts).",
            rb))
    for state, severity, what, then in (
            ("pending", "warning", "a memory row remap is pending", "it takes effect at the next GPU reset; until "
             "then the bad row stays in use"),
            ("failed", "critical", "a memory row remap failed", "the GPU has no spare row left for it and needs "
             "service (drain the node)")):
        out.append(_alert(
            p, "OtelGpuRowRemap", E.row_remap(state), severity, "hw_errors", f"{WHERE_GPU}: {what}",
            f"{WHERE_GPU} reports that {what}: {then}.", rb))
    share = th["throttle"]["share_min"]
    for reasons, severity in ((E.SLOWDOWN_REASONS, "warning"), (E.POWER_REASONS, "info")):
        out.append(_alert(
            p, "OtelGpuThrottledWhileTraining", E.throttled(reasons, share, p.gpu_window_s), severity, "throttle",
            f"{WHERE_GPU}: {{{{ $labels.otelgpu_clock_event_reason }}}} while training",
            f"{WHERE_GPU} had {{{{ $labels.otelgpu_clock_event_reason }}}} active {{{{ $value | humanizePercentage }}}} "
            f"of the last {duration(p.gpu_window_s)} while ranks on the node completed steps.",
            rb))
    out.append(_alert(
        p, "OtelGpuIdleWhileTraining", E.gpu_idle(th["gpu_idle"]["util_max"], p.gpu_window_s), "warning", "gpu_idle",
        f"{WHERE_GPU} idle while rank {{{{ $labels.otelgpu_rank }}}} trains",
        f"{WHERE_GPU} holds memory of rank {{{{ $labels.otelgpu_rank }}}}, which completes steps, yet its "
        f"utilization was {{{{ $value | humanizePercentage }}}} over {duration(p.gpu_window_s)}.",
        rb))
    return out


def _agent_missing(p: RuleParams) -> dict:
    return _alert(
        p, "OtelGpuAgentMissing", E.agent_missing(p.fresh_s, p.lookback_s, p.agent_scrape_job), "warning", "targets",
        "no node agent data from {{ $labels.host_name }}{{ $labels.instance }}",
        f"The otel-gpu agent of {{{{ $labels.host_name }}}}{{{{ $labels.instance }}}} sent nothing for more than "
        f"{duration(p.fresh_s)} (or its scrape target is down): that node's GPUs are not watched.",
        f"otel-gpu doctor (on that node); systemctl status otel-gpu-agent")
