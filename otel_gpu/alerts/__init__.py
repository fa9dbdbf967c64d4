"""Prometheus recording and alerting rules generated from the diagnosis thresholds.

`rules.groups(thresholds, params)` builds the rule groups as plain dicts (pure), `yamltext` renders
them, `otel-gpu alerts` writes or checks compose/prometheus-rules/otel-gpu.rules.yml. The numbers come
from `otel_gpu.diagnose.thresholds` (one source for the diagnosis and the alerts); windows and `for:`
durations from `params.RuleParams`.
"""
