"""Property tests of every value parser at the edge: flags of each subcommand, OTEL_* and
OTELGPU_* variables, diagnose times. Whatever the text, the outcome is a finite value within
its bounds, or one line and exit 2; never another exception."""
from __future__ import annotations

import contextlib
import io
import math
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.agent.cli import agent_config
from otel_gpu.cli import build_parser
from otel_gpu.diagnose.cli import MAX_TIME_S, parse_duration, parse_time, window_bounds
from otel_gpu.errors import ConfigError, UsageError
from otel_gpu.export import INTERVAL_MS, TIMEOUT_MS, otlp_settings
from otel_gpu.values import http_url, number

FAST = settings(max_examples=200, deadline=None)
NUMBERISH = st.one_of(
    st.text(max_size=12),
    st.floats().map(repr), st.floats().map(str), st.integers(-10**30, 10**30).map(str),
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-0", "0x10", "1_000", " 5 ", "٣",
                     "1e-400", "+1", ".5", "5."]))
URLISH = st.one_of(
    st.text(max_size=30),
    st.builds(lambda scheme, host, port, path: f"{scheme}{host}{port}{path}",
              st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "", "http:/"]),
              st.sampled_from(["", "c", "127.0.0.1", "[::1]", "a b", "host.example", "[::1", "@"]),
              st.sampled_from(["", ":4318", ":0", ":65535", ":99999", ":x", ":"]),
              st.sampled_from(["", "/", "/v1/metrics", "?q=1", "#f"])))


@FAST
@given(NUMBERISH, st.floats(-1e6, 1e6), st.floats(0, 1e6), st.sampled_from([int, float]), st.booleans())
def test_number_is_finite_and_within_bounds_or_one_line(raw, lo, span, kind, lo_open):
    hi = lo + span
    try:
        value = number(raw, "X", lo, hi, kind, lo_open)
    except ConfigError as exc:
        assert str(exc).startswith("X=") and "\n" not in str(exc)
        return
    assert isinstance(value, kind) and math.isfinite(value) and lo <= value <= hi
    assert not lo_open or value > lo


@FAST
@given(URLISH)
def test_http_url_has_a_scheme_and_a_host_or_one_line(raw):
    from urllib.parse import urlsplit

    try:
        url = http_url(raw, "U")
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    parts = urlsplit(url)
    assert parts.scheme.lower() in ("http", "https") and parts.hostname
    assert parts.port is None or 0 <= parts.port <= 65535


OTEL_VARS = ("OTEL_METRIC_EXPORT_INTERVAL", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_ENDPOINT",
             "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL")


@FAST
@given(st.dictionaries(st.sampled_from(OTEL_VARS), st.one_of(NUMBERISH, URLISH, st.sampled_from(["grpc", "http/protobuf"])),
                       max_size=5))
def test_otlp_settings_are_usable_or_refused(env):
    try:
        s = otlp_settings(env, default_interval_s=10)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert INTERVAL_MS[0] <= s.interval_s * 1000 <= INTERVAL_MS[1]
    assert TIMEOUT_MS[0] <= s.timeout_s * 1000 <= TIMEOUT_MS[1]
    assert s.protocol in ("grpc", "http/protobuf")
    assert s.endpoint is None or http_url(s.endpoint, "e") == s.endpoint


def _parse(argv):
    """(args, None) or (None, stderr) for a parse that exited."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            return build_parser().parse_args(argv), None
        except SystemExit as exc:
            assert exc.code == 2
            return None, err.getvalue()


AGENT_ENV = ("OTELGPU_INTERVAL", "OTELGPU_PROMETHEUS_PORT", "OTELGPU_FAKE_GPUS", *OTEL_VARS)


@FAST
@given(st.lists(st.tuples(st.sampled_from(["--interval", "--prometheus-port", "--fake-gpus"]), NUMBERISH), max_size=3),
       st.dictionaries(st.sampled_from(AGENT_ENV), st.one_of(NUMBERISH, URLISH), max_size=4))
def test_agent_flags_and_environment_give_a_sane_config_or_one_line(flags, env):
    args, err = _parse(["agent"] + [f"{flag}={value}" for flag, value in flags])
    if args is None:
        assert err.count("\n") == 1
        return
    try:
        config = agent_config(args, env, stdout_is_tty=False)
    except (UsageError, ConfigError) as exc:
        assert "\n" not in str(exc)
        return
    assert 0.1 <= config.interval_s <= 3600
    assert config.prometheus_port is None or 1 <= config.prometheus_port <= 65535
    assert 0 <= config.node.fake_gpus <= 64
    assert math.isfinite(config.otlp.interval_s) and math.isfinite(config.otlp.timeout_s)


TUNE_NUMBERS = {"--trials": (1, 100_000), "--trial-timeout": (0, 30 * 86400), "--poll": (0, 3600),
                "--settle": (0, 3600), "--prune-ratio": (1, 1000), "--prune-after": (1, math.inf),
                "--warmup-steps": (0, math.inf), "--min-steps": (1, math.inf), "--hidden-size": (1, math.inf),
                "--micro-batch": (1, math.inf), "--grad-accum": (1, math.inf), "--world-size": (1, math.inf),
                "--max-grad-norm": (0, math.inf), "--max-gpu-memory": (0, math.inf),
                "--export-interval": (10, 3_600_000), "--seed": (0, 2**32 - 1)}


@FAST
@given(st.sampled_from(sorted(TUNE_NUMBERS)), NUMBERISH)
def test_every_numeric_tune_flag_is_finite_and_bounded_or_one_line(flag, raw):
    args, err = _parse(["tune", "--base-config", "x.json", f"{flag}={raw}"])
    if args is None:
        assert err.count("\n") == 1 and flag in err
        return
    value = getattr(args, flag[2:].replace("-", "_"))
    lo, hi = TUNE_NUMBERS[flag]
    assert math.isfinite(value) and lo <= value <= hi


@FAST
@given(st.sampled_from(["tune --base-config x.json --prometheus", "tune --base-config x.json --otlp",
                        "run --pyroscope", "alerts --prometheus-url"]), URLISH)
def test_url_flags_are_urls_with_a_host_or_one_line(command, raw):
    *words, flag = command.split()
    args, err = _parse(words + [f"{flag}={raw}"])
    if args is None:
        assert err.count("\n") == 1
        return
    value = getattr(args, flag[2:].replace("-", "_"))
    assert http_url(value, "u") == value


@FAST
@given(st.one_of(NUMBERISH, st.from_regex(r"\A\d{1,25}(\.\d{0,3})?[smhdw]?(\d{1,3}[smhdw])?\Z")))
def test_durations_are_positive_and_bounded_or_one_line(text):
    try:
        value = parse_duration(text)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(value) and 0 < value <= 100 * 365 * 86400


NOW = 1_700_000_000.0


@FAST
@given(st.one_of(NUMBERISH, st.datetimes().map(lambda d: d.isoformat()),
                 st.text(max_size=8).map(lambda t: "now-" + t), st.sampled_from(["now", "now-1h", "now-"])))
def test_times_are_finite_unix_seconds_or_one_line(text):
    try:
        value = parse_time(text, NOW)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(value) and 0 <= value <= MAX_TIME_S


@FAST
@given(st.one_of(st.none(), NUMBERISH), st.one_of(st.none(), NUMBERISH), st.one_of(st.none(), NUMBERISH))
def test_a_window_is_a_non_empty_finite_interval_or_one_line(from_, to, last):
    try:
        start, end = window_bounds(SimpleNamespace(from_=from_, to=to, last=last), NOW)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert math.isfinite(start) and math.isfinite(end) and start < end


def test_argparse_errors_from_every_subcommand_are_one_line():
    for argv in (["agent", "--nope"], ["tune"], ["diagnose", "--nope"], ["dashboards", "--nope"], ["run", "--job"],
                 ["alerts", "--window", "soon"]):
        args, err = _parse(argv)
        assert args is None and err.count("\n") == 1 and err.startswith("otel-gpu"), (argv, err)

