"""The HTML report of a recorded run: findings, time series (uPlot) and flame graphs (d3-flame-graph),
one self-contained file. `build.write_report(dirs, out)`; `otel-gpu report RUN_DIR`."""
