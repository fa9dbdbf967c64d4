"""Trace analysis of PyTorch profiler (Kineto) traces with HTA 0.5.0 semantics.

Entry points: :func:`otel_gpu.trace.model.load_set` (read and filter a folder of per-rank
traces), :func:`otel_gpu.trace.analyze.analyze` (every table, findings, cross-rank summary),
:func:`otel_gpu.trace.diff.diff_sets` (run-to-run changes). See docs/trace.md.
"""
