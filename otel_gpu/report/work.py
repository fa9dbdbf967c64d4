"""The report's and the run summary's work lines: tokens/s, achieved TFLOP/s per GPU, MFU beside tensor
activity, and where the time went (diagnose/mfu.py, diagnose/account.py over the recorded window)."""
from __future__ import annotations

from ..diagnose import fmt
from ..diagnose.account import headline, summary as section
from ..diagnose.mfu import mfu_pct
from ..safe_text import html_text, visible

__all__ = ["html", "section", "summary_lines"]


def html(sec: dict) -> str:
    """The work section (text from the recording escaped)."""
    if not sec:
        return ""
    rows = "".join(f"<tr><td>{html_text(r['rank'])}</td><td>{html_text(r['gpu'])}</td><td>{html_text(r['model'])}</td>"
                   f"<td>{html_text(r['dtype'])}</td><td>{html_text(r['tflops'])}</td><td>{html_text(r['tokens'])}</td>"
                   f"<td>{html_text(r['mfu'])}</td></tr>" for r in sec["ranks"])
    acc = sec["account"]
    parts = "".join(f"<tr><td>{html_text(p['label'])}</td><td>{(mfu_pct if p['key'] == 'mfu' else fmt.pct)(p['share'])}</td>"
                    f"<td>{html_text(p['basis'])}</td></tr>"
                    for p in acc["parts"])
    notes = "".join(f"<li>{html_text(n)}</li>" for n in acc["notes"])
    job = sec["job"]
    return ('<section id="sec-work"><h2>Work: throughput and MFU</h2>\n'
            f"<p>Job: {html_text(headline(job))}</p>\n"
            + (f"<p>MFU basis: {html_text(job['basis'])}</p>\n" if job["basis"] else "")
            + '<table id="work"><tr><th>rank</th><th>GPU</th><th>model</th><th>dtype</th><th>achieved</th>'
            f"<th>tokens</th><th>MFU</th></tr>{rows}</table>\n"
            "<h3>Where the time went</h3>\n"
            + (f"<p>{html_text(acc['why_not'])}</p>" if acc["why_not"] else
               f'<table id="account"><tr><th>part</th><th>share of wall time</th><th>basis</th></tr>{parts}</table>')
            + (f"<ul>{notes}</ul>" if notes else "") + "</section>")


def summary_lines(sec: dict) -> list[str]:
    """The run summary's work lines (two spaces in, names shown `visible`)."""
    if not sec:
        return []
    job = sec["job"]
    out = [f"  work: {visible(headline(job))}"]
    parts = sec["account"]["parts"]
    if parts:
        out.append("  time: " + ", ".join(f"{p['label']} {mfu_pct(p['share']) if p['key'] == 'mfu' else fmt.pct(p['share'])}"
                                          for p in parts if p["share"] >= 0.0005 or p["key"] == "mfu"))
    return out
