"""Grafana dashboards as code: builders (`panels`), generation and drift check (`build`),
query extraction for tests (`queries`) and the `otel-gpu dashboards` command (`cli`).

The definitions live in `grafana/dashboards/*.dashboard.py`; grafanalib is the
`dashboards` extra, imported only by `panels` and the definitions.
"""
