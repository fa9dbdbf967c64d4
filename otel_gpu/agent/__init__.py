"""The node agent: sources -> store -> OTel instruments (OTLP) and a Prometheus scrape endpoint.

`node.py` builds the sources of this node, `sampler.py` reads them on one thread into `store.py`,
`runtime.py` wires exporters, the scrape endpoint (`exposition.py`) and the live view (`liveview.py`);
`cli.py` is `otel-gpu agent` and `otel-gpu doctor`.
"""
