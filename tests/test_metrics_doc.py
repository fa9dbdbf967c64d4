from pathlib import Path

from otel_gpu import metrics_doc, names

DOC = Path(__file__).parents[1] / "docs" / "metrics.md"


def test_metrics_doc_matches_the_code():
    assert DOC.read_text() == metrics_doc.render(), "regenerate: python -m otel_gpu.metrics_doc > docs/metrics.md"


def test_names_and_prometheus_forms_are_unique():
    specs = names.all_specs()
    assert len({s.name for s in specs}) == len(specs)
    assert len({s.prometheus_name() for s in specs}) == len(specs)


def test_prometheus_forms_follow_the_otlp_translation():
    assert names.GPU_POWER.prometheus_name() == "hw_power_watts"
    assert names.GPU_PCIE_IO.prometheus_name() == "hw_gpu_io_bytes_total"
    assert names.GPU_UTILIZATION.prometheus_name() == "hw_gpu_utilization_ratio"
    assert names.GPU_STATUS.prometheus_name() == "hw_status"   # an updowncounter: no _ratio
    assert names.GPU_ERRORS.prometheus_name() == "hw_errors_total"
    assert names.NET_LIMIT.prometheus_name() == "hw_network_bandwidth_limit_bytes_per_second"


def test_no_name_is_another_series_min_or_max_companion():
    """A windowed gauge exports `<name>.min` / `<name>.max` too: no other metric may be called that."""
    specs = names.all_specs()
    companions = {f"{s.name}.{c}" for s in specs if s.windowed and s.companions for c in ("min", "max")}
    assert {s.name for s in specs} & companions == set()
