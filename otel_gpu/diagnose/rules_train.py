"""Training-side rules: checkpoint stalls (who saves and who waits: saves.py), input-bound steps, drops at epoch boundaries."""
from __future__ import annotations

import statistics

from . import fmt, saves
from . import timeseries as ts
from .findings import Finding, missing_input, severity_for
from .thresholds import Thresholds
from .model import RankStats, Window

PHASE_EPS = 0.01   # ranks in a phase (timeline value) above this: the phase is happening


def _during(w: Window, mask: list[bool], name: str) -> tuple[float | None, float | None]:
    """Mean of timeline series `name` inside `mask` and over the rest of the training time."""
    return ts.during(w, mask, w.timeline.get(name))


def checkpoint(w: Window, th: Thresholds) -> list[Finding]:
    """Share of wall time in the checkpoint phase; who saves and who waits; storage writes and GPU
    activity (or the step rate) during saves."""
    t = th["checkpoint"]
    ranks = [r for r in w.ranks if r.phases.get("checkpoint", 0.0) > 0]
    if not ranks:
        return []
    def saving_s(r) -> float:   # the save's own time and the waits inside it (a sharded save's gathers)
        return r.phases["checkpoint"] + r.collective_by_phase.get("checkpoint", 0.0)

    worst = max(ranks, key=lambda r: saving_s(r) / (w.rank_wall_s(r) or 1.0))
    wall = w.rank_wall_s(worst)
    ckpt = saving_s(worst)
    share = ckpt / wall if wall > 0 else 0.0
    n = max(len(w.ranks), 1)
    lost = ckpt * n   # synchronous training: every rank waits for the slowest save
    saving = saves.savers(ranks)
    waits = saves.waiting(w.ranks, saving)
    mask = ts.phase_mask(w.timeline, "checkpoint", PHASE_EPS)
    count, ranges, every, seen_note = _saves(worst, ts.events(w.timeline.t, mask, [1.0] * len(mask), w.step_s))
    details = []
    if len(w.ranks) > 1:
        details.append("saving: " + ", ".join(f"rank {r.rank}" for r in saving)
                       + ("; waiting for the saves: " + ", ".join(f"rank {k} ({fmt.secs(v)} more in collectives)"
                                                               for k, v in waits.items()) if waits else ""))
    write_in, write_out = _during(w, mask, "disk_write")
    if write_in is not None and write_out is not None:
        details.append(f"storage writes {fmt.rate(write_in)} during saves vs {fmt.rate(write_out)} otherwise")
    sig = ts.activity(w, training_only=False)
    act_in = act_out = rate_share = None
    if sig is not None and sig[0] == "step rate":
        rate_share, rate_note = saves.step_rate_during(w, ranges)
        details.append(rate_note)
    elif sig is not None and any(mask):
        act_in, act_out = ts.during(w, mask, sig[1])
        if act_in is not None and act_out:
            details.append(f"{sig[0]} {fmt.pct(act_in)} during saves vs {fmt.pct(act_out)} otherwise")
    target = t["share_warning"] * 0.5
    advice = ["save asynchronously (torch.distributed.checkpoint.async_save, DeepSpeed's decoupled/Nebula "
              "checkpointing) so training continues while the shards are written",
              "write to local NVMe and copy to shared storage in the background"]
    if every and share > target:
        advice.append(f"or save less often: every {fmt.secs(every * share / target)} instead of every "
                      f"{fmt.secs(every)} brings the share to about {fmt.pct(target)}")
    return [Finding(
        rule="checkpoint",
        title=f"checkpoints take {fmt.pct(share)} of the time",
        severity=severity_for(share, t["share_warning"], t["share_critical"]),
        confidence="high" if len(w.ranks) and wall > 0 else "medium",
        seen=f"rank {worst.rank} on {worst.host} spent {fmt.secs(ckpt)} of {fmt.secs(wall)} saving checkpoints"
             + (f" ({count} save{'s' if count != 1 else ''}" + (f", one every {fmt.secs(every)}" if every else "")
                + ")" if count else "")
             + seen_note + ("; " + "; ".join(details) if details else ""),
        why=f"in synchronous training every rank waits for the slowest save: about {fmt.gpu_time(lost, w.unit)} "
            f"({fmt.pct(share)} of the job's time)",
        action="; ".join(advice),
        lost_s=lost, lost_share=share,
        basis="checkpoint phase seconds of the slowest rank x ranks, over that rank's wall time in the window; "
              f"savers: ranks with at least {saves.SAVER_SHARE:.0%} of its checkpoint seconds (a phase's own time, "
              "collective waits excluded)"
              + ("; step rate during saves: steps completed inside save windows per second, over the rate outside "
                 "them, from step-rate points wholly inside a save (a stall reads 0%, never above normal)"
                 if sig is not None and sig[0] == "step rate" else ""),
        where={"ranks": [r.rank for r in saving], "nodes": sorted({r.host for r in saving})},
        ranges=ranges,
        evidence={"checkpoint_s": round(ckpt, 3), "wall_s": round(wall, 3), "share": round(share, 4),
                  "saves": count, "every_s": every, "ranges_seen": len(ranges), "disk_write_Bps_during": write_in,
                  "disk_write_Bps_outside": write_out, "activity_during": act_in, "activity_outside": act_out,
                  "step_rate_during_share": rate_share, "savers": [r.rank for r in saving],
                  "waiting": {k: round(v, 3) for k, v in waits.items()},
                  "checkpoint_s_by_rank": {r.rank: round(r.phases.get("checkpoint", 0.0), 3) for r in w.ranks}},
    )]


def _saves(r: RankStats, drops) -> tuple[int, list[tuple[float, float]], float | None, str]:
    """(save count, (start, end) of the saves seen, seconds between save starts, a note) of rank `r`:
    from its checkpoint events (count exact; each export shows the latest save's start and end), else
    from the checkpoint-phase occupancy of the timeline (`drops`, approximate)."""
    n = saves.count(r)
    if n is None:
        ranges = [(e.start, e.end) for e in drops]
        every = statistics.median(b[0] - a[0] for a, b in zip(ranges, ranges[1:])) if len(ranges) >= 2 else None
        return len(ranges), ranges, every, "; save times estimated from phase time (no checkpoint events)"
    ranges = sorted(r.save_ranges)
    every, note = None, ""
    if len(ranges) >= 2:
        gaps = [b[0] - a[0] for a, b in zip(ranges, ranges[1:])]
        every = statistics.median(gaps) if len(ranges) == n else (ranges[-1][0] - ranges[0][0]) / max(1, n - 1)
    if len(ranges) < n:
        note = (f"; start and end times seen for {len(ranges)} of them (several saves ended within one export "
                f"interval)")
    return n, ranges, every, note


def data_wait_share(r: RankStats, wall_s: float) -> float:
    """A rank's data_wait seconds over its time, in [0, 1]: its wall time `wall_s` (s), or the seconds its
    exclusive phases add up to where those are more (counters read at export times on both edges of the window
    can count a phase past the wall time estimated from the step counter; 0 when neither is positive)."""
    wait = max(0.0, r.phases.get("data_wait", 0.0))
    total = max(wall_s, sum(max(0.0, s) for s in r.phases.values()))
    return min(1.0, wait / total) if total > 0 else 0.0


def input_bound(w: Window, th: Thresholds) -> list[Finding]:
    """Data-wait share every rank pays (the least of the ranks': one rank's slower loader makes it a
    straggler instead, see the straggler rule); GPU idle while waiting; whether the CPU has capacity."""
    t = th["input"]
    if not w.ranks:
        return []
    if not any("data_wait" in r.phases for r in w.ranks):
        if w.source == "recording":   # `otel-gpu run` already times DataLoader iteration: none was iterated
            needs = ("this job's batches do not come from a torch DataLoader (whose iteration `otel-gpu run` "
                     "times as data_wait): wrap your own batch fetch in `with otel_gpu.training.phase('data_wait'):` "
                     "to measure it; until then its time is part of the time outside any phase (the unphased rule)")
        else:
            needs = ("needs the data_wait phase: measured for DataLoader iteration under `otel-gpu run` / "
                     "`opentelemetry-instrument`, or `otel_gpu.training.phase('data_wait')` around your batch fetch")
        return [missing_input("input", "Input-bound (waiting for batches)", needs, ["data-wait phase"])]
    shares = {r.rank: data_wait_share(r, w.rank_wall_s(r)) for r in w.ranks}
    least = min(shares, key=shares.get)
    share = shares[least]
    worst = max(w.ranks, key=lambda r: shares[r.rank])
    worst_share = shares[worst.rank]
    if share < t["share_warning"] * 0.5:
        return []
    waited = sum(share * w.rank_wall_s(r) for r in w.ranks)
    cpu_text, action, cpu = _job_cpu(w, t["cpu_saturated"])
    mask = ts.phase_mask(w.timeline, "data_wait", 0.5)
    gpu = ""
    if any(mask):
        util_in, util_out = _during(w, mask, "util")
        if util_in is not None and util_out is not None:
            gpu = f"; GPU utilization {fmt.pct(util_in)} while ranks wait for data vs {fmt.pct(util_out)} otherwise"
    spread = (f" (rank {least} {fmt.pct(share)} to rank {worst.rank} on {worst.host} {fmt.pct(worst_share)})"
              if len(w.ranks) > 1 else "")
    return [Finding(
        rule="input",
        title=f"input-bound: {'every rank waits' if len(w.ranks) > 1 else 'the rank waits'} for data "
              f"{fmt.pct(share)} of the time",
        severity=severity_for(share, t["share_warning"], t["share_critical"]),
        confidence="high",
        seen=f"data_wait at least {fmt.pct(share)} of wall time on each of {fmt.count(len(w.ranks), 'rank')}{spread}; "
             f"{cpu_text}{gpu}",
        why=f"{'the GPU has nothing to do' if w.gpus else 'a rank computes nothing'} while a rank waits for its batch: "
            f"about {fmt.gpu_time(waited, w.unit)} "
            f"({fmt.pct(share)} of the job's time)",
        action=action, lost_s=waited, lost_share=share,
        basis="the least data_wait share of any rank (what every rank pays; a rank waiting longer than the "
              "others is a straggler) x each rank's wall time in the window",
        where={"ranks": [r.rank for r in w.ranks], "nodes": sorted({r.host for r in w.ranks})},
        evidence={"share": round(share, 4), "per_rank_share": {k: round(v, 4) for k, v in shares.items()},
                  "job_cpu_share_max": cpu, "worst_rank": worst.rank, "worst_share": round(worst_share, 4)},
    )]


MORE_WORKERS = "more DataLoader workers (num_workers), pin_memory=True, a larger prefetch_factor, persistent_workers=True"


def _job_cpu(w: Window, saturated: float) -> tuple[str, str, float | None]:
    """(what the job's own CPU use says, the advice, the largest share of a node's CPUs the job used).

    The job's processes (its ranks and their DataLoader workers, as the node agent reads them) are
    judged, never the whole host: other processes' CPU use says nothing about whether this loader
    waits on CPU work. At or above `saturated` of a node's CPUs the loader is starved of CPU; below it
    the job leaves CPUs unused and more workers can overlap the wait (a loader that sleeps or waits on
    I/O uses little CPU). Where the host is busier than the job, that is said, not judged."""
    used = [(n, n.job_cpu / n.cpus) for n in w.nodes if n.job_cpu is not None and n.cpus]
    if not used:
        why = ("no per-process CPU of the job's processes was read" if w.agent is not False
               else "no node agent ran" + ("; record without `--no-agent`" if w.source == "recording" else ""))
        return (f"the job's CPU use not checked: {why}",
                MORE_WORKERS + " (whether the job's processes leave CPUs free was not checked)", None)
    node, share = max(used, key=lambda x: x[1])
    own = f"the job's processes (ranks and DataLoader workers) used {node.job_cpu:.2f} of {node.cpus:.0f} CPUs " \
          f"({fmt.pct(share)}) on {node.host}"
    if node.others_cpu is not None and node.others_cpu >= 0.2:
        own += f"; the host was {fmt.pct(node.cpu_busy)} busy, the rest other processes'"
    if share >= saturated:
        return (own + ": the loader is starved of CPU",
                "the loader is starved of CPU: move decoding/augmentation off the critical path (pre-process offline, "
                "GPU decoding such as DALI), fewer ranks or workers per core", share)
    return own + ": CPUs left for the loader", MORE_WORKERS, share


def epoch_boundaries(w: Window, th: Thresholds) -> list[Finding]:
    """Activity drops at data-wait bursts (epoch boundaries). (Evaluation: evaluation.py.)"""
    sev = th["severity"]
    out = []
    # epoch boundaries: data_wait bursts well above their usual level, with activity dropping
    dw = w.timeline.get("phase_data_wait")
    sig = ts.activity(w)   # training time only: start-up is no epoch boundary
    if dw is not None and sig is not None:
        dw = ts.only(dw, ts.training_mask(w))
        med = ts.median(dw) or 0.0
        n_ranks = max(len(w.ranks), 1)
        burst = [v is not None and v > max(3 * med, 0.5 * n_ranks) for v in dw]
        act_med = ts.median(sig[1]) or 0.0
        evts = [e for e in ts.events(w.timeline.t, burst, dw, w.step_s)
                if (ts.mean_where(sig[1], [e.start <= x <= e.end for x in w.timeline.t]) or 0.0) < 0.5 * act_med]
        if len(evts) >= 2:
            lost = sum(e.duration_s for e in evts) * n_ranks
            lost_share = lost / (w.gpu_time_s() or 1.0)
            out.append(Finding(
                rule="epoch", title=f"activity drops at {len(evts)} data-loading bursts (epoch boundaries)",
                severity=severity_for(lost_share, sev["warning_share"], sev["critical_share"]),
                confidence="medium",
                seen=f"{len(evts)} bursts where most ranks wait for data and {sig[0]} falls below half its median, "
                     f"{fmt.secs(statistics.fmean(e.duration_s for e in evts))} each",
                why=f"the loader restarts or refills between epochs: about {fmt.gpu_time(lost, w.unit)} of {w.unit} time",
                action="DataLoader(persistent_workers=True), a larger prefetch_factor, and shuffling that does not "
                       "rebuild the dataset index every epoch",
                lost_s=lost, lost_share=lost_share, basis="burst durations x ranks",
                ranges=[(e.start, e.end) for e in evts], evidence={"bursts": len(evts)}))
    return out
