"""Recording a run without a server: loopback OTLP and Pyroscope receivers into one SQLite file per node.

`session.RecordedRun` is what `otel-gpu run` uses; `reader.Recording` reads run directories back;
`window.recorded_window` turns one into a diagnosis window. Format: docs/record.md.
"""
