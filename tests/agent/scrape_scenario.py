"""A fixed, seeded sequence of puts and scrapes through the agent's store, families and renderer.

`scrapes()` returns every scrape's bytes. `tests/agent/data/scrape_golden.txt` holds their
SHA-256 as rendered by the agent before the scrape path was made cheaper (~75 scrapes, 1.9 MB of
text: the digests stand for it); the test compares them. Regenerate the golden (only when the
exposition is meant to change) with the first line below; the second writes the texts themselves,
to diff two checkouts' scrapes:

    python tests/agent/scrape_scenario.py [--root CHECKOUT] > tests/agent/data/scrape_golden.txt
    python tests/agent/scrape_scenario.py --full [--root CHECKOUT] > scrapes.txt

Every family the agent exports gets series; values include ties and constant runs (window
extremes that leave the window), NaN and infinities, ints, bools and huge counters; series
appear, disappear, change order and come back with equal but new attribute dicts; some scrapes
repeat at the same instant, some come after a gap longer than the window.
"""
from __future__ import annotations

import hashlib
import random
import sys

SEED = 20261125
WINDOW_S = 1.0
ROUNDS = 60


class _ScenarioSource:
    """Reports, each read, the readings `plan` gives for the current round."""

    def __init__(self, name: str, plan):
        self.name, self.plan, self.partial_errors, self.round = name, plan, 0, 0

    def read(self):
        return self.plan(self.round)


def _values(rng: random.Random):
    special = [0.0, 0.5, 1.0, 1 / 3, 123456789012.5, 7, True, False, float("nan"), float("inf"),
               float("-inf"), 1e-7, 2 ** 53 + 1, -0.0, 99.99999949]
    def pick() -> float:
        r = rng.random()
        if r < 0.35:
            return rng.choice(special)
        if r < 0.55:
            return round(rng.uniform(0, 1), 2)   # ties
        return rng.uniform(-5, 1e4)
    return pick


def scrapes() -> list[bytes]:
    from otel_gpu import names
    from otel_gpu.agent.exposition import Renderer
    from otel_gpu.agent.sampler import Exported, Sampler
    from otel_gpu.agent.store import Store
    from otel_gpu.readings import Reading

    rng = random.Random(SEED)
    pick = _values(rng)
    specs = [s for s in names.all_specs()
             if s.kind != "histogram" and not s.name.startswith(names.PREFIX + "train.")
             and not s.name.startswith(names.PREFIX + "agent.")]
    # per source: spec -> attribute dicts, reused from round to round (the store's identity fast path)
    series = {}
    for i, spec in enumerate(specs):
        source = ("gpu", "host", "net")[i % 3]
        count = rng.choice((1, 1, 2, 3))
        series.setdefault(source, []).extend(
            (spec, {names.HW_ID: f"dev-{k}", "label.with-dash": 'quote " back \\ nl \n %r %%', "z": str(k)})
            for k in range(count))
    # constant runs for some series: their extremes leave the window while equal values stay
    constant = {id(attrs): pick() for source in series.values() for _, attrs in source if rng.random() < 0.3}

    def plan_for(name: str):
        def plan(r: int):
            out = []
            for spec, attrs in series[name]:
                if name == "net" and 20 <= r < 26 and attrs["z"] == "1":
                    continue   # gone for a while, then back
                if name == "host" and r in (30, 31):
                    attrs = dict(attrs)   # equal, new dicts
                out.append(Reading(spec, constant[id(attrs)] if id(attrs) in constant else pick(), attrs))
            if name == "gpu" and 40 <= r < 44:
                out.reverse()   # the same series in another order
            return out
        return plan

    clock = [1000.0]
    sources = [_ScenarioSource(name, plan_for(name)) for name in ("gpu", "host", "net")]
    store = Store(window_s=WINDOW_S)
    sampler = Sampler(sources, store, 0.1, clock=lambda: clock[0])
    exported = Exported(sampler, export_failures=lambda: 3, scrape_refused=lambda: 0)
    renderer = Renderer(exported.families, {names.HOST: "node-1", "otelgpu.job": "job \"x\""},
                        {"service.name": "otel-gpu-agent", "host.name": "node-1", "9 odd.key": "v\nw"})
    out = []
    for r in range(ROUNDS):
        clock[0] += 0.1 if r != 50 else 3 * WINDOW_S   # round 50: after a gap longer than the window
        for source in sources:
            source.round = r
            if not (source.name == "net" and r in (10, 11)):   # net misses two rounds
                sampler.read_once(source)
        sampler.rounds = r
        out.append(renderer.render())
        if r % 7 == 0:
            out.append(renderer.render())          # again at the same instant
        if r % 11 == 0:
            clock[0] += 0.06                       # a scrape between rounds
            out.append(renderer.render())
    return out


def golden_text(bodies: list[bytes], full: bool = False) -> str:
    """A line per scrape with its number, size and SHA-256; with `full`, each body under its line."""
    parts = []
    for i, body in enumerate(bodies):
        parts.append(f"=== scrape {i} bytes {len(body)} sha256 {hashlib.sha256(body).hexdigest()}\n")
        if full:
            parts.append(body.decode())
    return "".join(parts)


if __name__ == "__main__":
    if "--root" in sys.argv:
        sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])
    sys.stdout.write(golden_text(scrapes(), full="--full" in sys.argv))
