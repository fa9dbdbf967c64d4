"""The report's per-rank health table: time in Python's garbage collector per step (gen 2 apart) and the
CUDA caching allocator per device (retries, OOMs, peak reserved, fragmentation), from the diagnosis window."""
from __future__ import annotations

from ..diagnose import fmt
from ..diagnose.health import gc_per_step
from ..diagnose.model import Window
from ..safe_text import html_text

__all__ = ["html", "section"]


def section(w: Window | None) -> list[dict]:
    """One row per rank that exported GC or allocator series; [] when none did (or no window)."""
    if w is None:
        return []
    rows = []
    for r in w.ranks:
        if not r.gc_s and not r.alloc:
            continue
        steps = r.step_count or 0.0
        per = gc_per_step(r)
        gc = (f"{fmt.secs(per)} ({fmt.secs(r.gc_s.get('2', 0.0) / steps)} in {r.gc_n.get('2', 0.0) / steps:.2g} full "
              "collections)" if per is not None else "not exported")
        alloc = "; ".join(
            f"cuda:{d}: {a.retries or 0:.0f} retries, {a.ooms or 0:.0f} OOMs, reserved peak {fmt.size(a.reserved_max_b)}, "
            f"fragmentation {fmt.pct(a.fragmentation) if a.fragmentation is not None else 'not read'}"
            for d, a in sorted(r.alloc.items())) or "not exported (no CUDA in this rank)"
        rows.append({"rank": r.rank, "host": r.host, "gc": gc, "allocator": alloc})
    return rows


def html(rows: list[dict]) -> str:
    """The health section (text from the recording escaped); '' without rows."""
    if not rows:
        return ""
    body = "".join(f"<tr><td>{html_text(r['rank'])}</td><td>{html_text(r['host'])}</td><td>{html_text(r['gc'])}</td>"
                   f"<td>{html_text(r['allocator'])}</td></tr>" for r in rows)
    return ('<section id="sec-health"><h2>Garbage collector and CUDA allocator</h2>\n'
            '<table id="health"><tr><th>rank</th><th>host</th><th>Python GC per step</th><th>CUDA allocator</th></tr>'
            f"{body}</table></section>")
