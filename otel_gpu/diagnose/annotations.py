"""Findings as Grafana annotations, so they show on the dashboards at the time they happened.

One annotation per time range of a finding (the whole window when it has none), posted to
Grafana's HTTP API (`POST /api/annotations`, service-account token as Bearer) as organisation
annotations tagged `otel-gpu`, `diagnose`, the rule, the severity and the job: a dashboard shows
them with an annotation query filtered by those tags.
"""
from __future__ import annotations

import html

import httpx

from ..http_deadline import deadline_client, request

MAX_PER_FINDING = 20


class AnnotationError(RuntimeError):
    """One line: Grafana refused or could not be reached."""


def annotation_payloads(report: dict, dashboard_uid: str | None = None) -> list[dict]:
    """Grafana annotation bodies for a report dict (`Report.as_dict()`); times in ms (pure)."""
    out = []
    job = report.get("job") or "all"
    for f in report["findings"]:
        if f["missing"]:
            continue
        ranges = f["ranges"][:MAX_PER_FINDING] or [(report["start"], report["end"])]
        text = (f"<b>{html.escape(f['title'])}</b><br>{html.escape(f['seen'])}<br>"
                f"<i>next:</i> {html.escape(f['action'])}")
        for a, b in ranges:
            body = {"time": int(a * 1000), "timeEnd": int(b * 1000), "text": text,
                    "tags": ["otel-gpu", "diagnose", f["rule"], f["severity"], f"job:{job}"]}
            if dashboard_uid:
                body["dashboardUID"] = dashboard_uid
            out.append(body)
    return out


def post_annotations(grafana_url: str, token: str, payloads: list[dict], timeout: float = 10.0) -> int:
    """POST each payload; the number created. AnnotationError on the first failure."""
    base = grafana_url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    done = 0
    with deadline_client(timeout) as client:
        for body in payloads:
            try:
                r = request(client, "POST", f"{base}/api/annotations", json=body, headers=headers, timeout=timeout)
            except httpx.TimeoutException:
                raise AnnotationError(f"Grafana at {base} did not answer within {timeout:g} s"
                                      f" ({done} of {len(payloads)} written)") from None
            except httpx.HTTPError as exc:
                raise AnnotationError(f"Grafana at {base} is unreachable: {exc}") from None
            if r.status_code != 200:
                msg = " ".join(r.text.split())[:200]
                raise AnnotationError(f"Grafana at {base} refused an annotation: HTTP {r.status_code} {msg}"
                                      f" ({done} of {len(payloads)} written)")
            done += 1
    return done
