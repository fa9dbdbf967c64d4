"""The part of the Prometheus Operator's ServiceMonitor schema (CRD monitoring.coreos.com/v1) that our
manifest uses, as JSON Schema: field names and types as the CRD's openAPIV3Schema gives them, unknown
fields refused where we use an object, so a typo fails. Not the whole CRD (it is ~1,000 lines and not
shipped with any package here)."""
from __future__ import annotations

DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
    "matchExpressions": {"type": "array"}}}
RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}},
    "separator": {"type": "string"}, "targetLabel": {"type": "string"}, "regex": {"type": "string"},
    "modulus": {"type": "integer"}, "replacement": {"type": "string"},
    "action": {"enum": ["replace", "keep", "drop", "hashmod", "labelmap", "labeldrop", "labelkeep",
                        "lowercase", "uppercase", "keepequal", "dropequal"]}}}
ENDPOINT = {"type": "object", "additionalProperties": False, "properties": {
    "port": {"type": "string"}, "targetPort": {"type": ["string", "integer"]}, "path": {"type": "string"},
    "scheme": {"enum": ["http", "https"]}, "interval": DURATION, "scrapeTimeout": DURATION,
    "honorLabels": {"type": "boolean"}, "relabelings": {"type": "array", "items": RELABEL},
    "metricRelabelings": {"type": "array", "items": RELABEL}}}
SCHEMA = {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "properties": {
    "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "ServiceMonitor"},
    "metadata": {"type": "object", "required": ["name"]},
    "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"], "properties": {
        "selector": LABEL_SELECTOR, "jobLabel": {"type": "string"},
        "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
            "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
        "endpoints": {"type": "array", "minItems": 1, "items": ENDPOINT}}}}}
