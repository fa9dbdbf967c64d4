"""A diagnosis window: the job's series between two times, read from a Prometheus-compatible server.

`fetch_window` fills a `Window` (model.py) with four aggregated queries (ranks, GPUs, nodes, one
job-wide timeline), one of busy time per rank, the checkpoint times when the job saved, and one retry
per family when the agent's series carry no job label (then they are selected by the hosts the job's
ranks ran on); parse.py turns the answers into the window's parts.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

from .. import names as N
from ..promql import PromClient, Series
from . import queries as Qb
from .model import DiagnoseError, GpuStats, NodeStats, RankStats, Timeline, Window
from .parse import (estimate_interval, occupancy, parse_busy, parse_gpus, parse_nodes, parse_ranks,
                    parse_save_ranges, parse_timeline, split_union)

__all__ = ["DiagnoseError", "GpuStats", "NodeStats", "RankStats", "Timeline", "Window", "estimate_interval",
           "fetch_window", "occupancy", "parse_busy", "parse_gpus", "parse_nodes", "parse_ranks",
           "parse_save_ranges", "parse_timeline", "resolution", "split_union"]

MAX_POINTS = 720   # timeline resolution: at most this many steps over the window
SUB_POINTS = (720, 120)   # subquery resolution for first/last times: window / this, up to 1 h / beyond


# ---- fetching --------------------------------------------------------------------------------

def resolution(duration_s: float, max_points: int = MAX_POINTS) -> float:
    """Timeline step (whole seconds, >= 1) giving at most `max_points` steps over the window."""
    return float(max(1, math.ceil(duration_s / max_points)))


def fetch_window(client: PromClient, job: str | None, start: float, end: float, *,
                 require_steps: bool = True) -> Window:
    """Read the window's series; DiagnoseError when there is nothing to diagnose."""
    if end <= start:
        raise DiagnoseError(f"empty window: --to ({end:.0f}) is not after --from ({start:.0f})")
    dur = end - start
    if job is None:
        job = only_job(client, end, dur)
    w = Window(job=job, start=start, end=end)
    res = resolution(dur)
    sub = max(0.01, dur / (SUB_POINTS[0] if dur <= 3600 else SUB_POINTS[1]))
    job_sel = Qb.job_matcher(job)
    w.ranks = parse_ranks(client.query(Qb.rank_summary(job_sel, dur, sub), time=end))
    # GPU and node numbers over training time (first step to last step), not the start-up before it
    w.interval_s = estimate_interval(w.ranks, [])
    _last_from_count(w.ranks, w.interval_s)
    w.set_training_span()
    a, b = w.summary_span()
    tdur = max(0.001, b - a)
    tsub = max(0.01, tdur / (SUB_POINTS[0] if tdur <= 3600 else SUB_POINTS[1]))
    gpus_q, nodes_q = _parallel(client, b, [Qb.gpu_summary(job_sel, tdur, tsub), Qb.node_summary(job_sel, tdur)])
    w.gpus, w.nodes = parse_gpus(gpus_q), parse_nodes(nodes_q)
    hosts = sorted({r.host for r in w.ranks if r.host})
    agent_sel = job_sel
    if job and hosts and not (w.gpus or w.nodes):   # the agent's series carry no job label: by host
        sel = Qb.hosts_matcher(hosts)
        w.gpus = parse_gpus(client.query(Qb.gpu_summary(sel, tdur, tsub), time=b))
        w.nodes = parse_nodes(client.query(Qb.node_summary(sel, tdur), time=b))
        if w.gpus or w.nodes:
            agent_sel = sel
    if agent_sel != job_sel:
        w.notes.append("the agent's series carry no job label: read by the hosts of the job's ranks")
    if w.gpus or w.nodes:
        w.agent = True
    what = f"job {job!r}" if job else "any job"
    if not (w.ranks or w.gpus or w.nodes):
        raise DiagnoseError(f"empty window: no otel-gpu series for {what} between "
                            f"{_iso(start)} and {_iso(end)}")
    if require_steps and not w.ranks:
        raise DiagnoseError(f"no step metrics for {what} between {_iso(start)} and {_iso(end)} "
                            f"(otelgpu_train_steps_total): instrument the training loop (otel_gpu.training) "
                            f"or pass --gpu-only")
    w.interval_s = estimate_interval(w.ranks, w.gpus)
    _last_from_count(w.gpus, w.interval_s)
    if any(r.saves for r in w.ranks):
        ranges = parse_save_ranges(client.query(Qb.checkpoint_times(job_sel, dur), time=end), start, end)
        for r in w.ranks:
            r.save_ranges = ranges.get((r.host, r.rank), [])
    w.step_s = res
    smooth = res + 2 * w.interval_s
    w.timeline = parse_timeline(client.query_range(Qb.timeline(job_sel, agent_sel, smooth), start, end, res),
                                start, end, res, ranks=max(1, len(w.ranks)))
    if len(w.ranks) > 1 and all(r.collective_s is not None for r in w.ranks):
        w.busy = parse_busy(client.query_range(Qb.rank_busy(job_sel, smooth), start, end, res), w.timeline.t)
    return w


def _last_from_count(xs, interval_s: float) -> None:
    """A series that ended before the window did: its last point from its count of points."""
    for x in xs:
        if x.last_t is None and x.first_t is not None and x.samples:
            x.last_t = x.first_t + (x.samples - 1) * interval_s


def only_job(client: PromClient, end: float, dur: float) -> str | None:
    """The one job with step metrics in the window; DiagnoseError naming them when there are several."""
    steps = N.TRAIN_STEPS.prometheus_name()
    jobs = sorted(s.labels.get("otelgpu_job", "") for s in
                  client.query(f"count by (otelgpu_job) (last_over_time({steps}[{Qb.dur(dur)}]))", time=end))
    if len(jobs) > 1:
        shown = ", ".join(j or "(no job label)" for j in jobs[:10]) + (" ..." if len(jobs) > 10 else "")
        raise DiagnoseError(f"{len(jobs)} jobs have step metrics in the window ({shown}): pass --job")
    return jobs[0] or None if jobs else None


def _parallel(client: PromClient, at: float, exprs: list[str]) -> list[list[Series]]:
    """Instant queries at `at`, concurrently, each on its own connection; counted in `client.stats`."""
    clients = [PromClient(client.base_url, timeout=client.timeout, name=client.name, params=client.params) for _ in exprs]
    try:
        with ThreadPoolExecutor(len(exprs)) as pool:
            futures = [pool.submit(c.query, e, at) for c, e in zip(clients, exprs)]
            results = []
            for f in futures:
                results.append(f.result())   # the first PromError is raised here
        return results
    finally:
        st = client.stats
        for c in clients:
            c.close()
            st.queries += c.stats.queries
            st.requests += c.stats.requests
            st.errors += c.stats.errors
            st.seconds += c.stats.seconds
            st.query_seconds += c.stats.query_seconds
            for k, v in c.stats.by_endpoint.items():
                st.by_endpoint[k] = st.by_endpoint.get(k, 0) + v


def _iso(t: float) -> str:
    from datetime import datetime, timezone
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
