"""Grafana's variable interpolation (otel_gpu.dashboards.interpolate) and the selector parser, as properties.

Whatever the values (dots, regex metacharacters, quotes), a selector the dashboards write
must match exactly the selected values once Grafana has interpolated it: the Prometheus
datasource's default escaping in "..." and the regex format in backquotes for Pyroscope.
A few interpolated selectors also go through Prometheus 3's own parser (promtool).
"""
from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from otel_gpu.dashboards.interpolate import (
    ALL, PROMETHEUS, PYROSCOPE, Variable, escape_regex, format_value, interpolate,
)
from otel_gpu.dashboards.queries import parse_selector
from tests.servers import CACHE

PROMTOOL3 = os.environ.get("OTELGPU_PROMTOOL3") or str(CACHE / "prometheus3" / "usr" / "bin" / "promtool")
MULTI = Variable("v", multi=True, include_all=True)                       # like $node: All is every option
MULTI_STAR = Variable("v", multi=True, include_all=True, all_value=".*")  # like $job, $rank
SINGLE = Variable("v")                                                    # like $rank_b

printable = st.characters(min_codepoint=0x20, max_codepoint=0x2FF, blacklist_characters="`")
value = st.text(printable, min_size=1, max_size=12)
values = st.lists(value, min_size=1, max_size=4, unique=True)


def regex_of(selector: str) -> str:
    ((label, op, regex),) = parse_selector(selector)
    assert (label, op) == ("l", "=~")
    return regex


@settings(max_examples=200, deadline=None)
@given(chosen=values, other=value)
def test_pyroscope_regex_in_backquotes_matches_exactly_the_chosen_values(chosen, other):
    text = interpolate("{l=~`${v:regex}`}", PYROSCOPE, {"v": MULTI}, {"v": chosen}, {"v": chosen})
    regex = regex_of(text)
    assert all(re.fullmatch(regex, v) for v in chosen)
    assume(other not in chosen)
    assert not re.fullmatch(regex, other)


@settings(max_examples=200, deadline=None)
@given(chosen=st.lists(st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, blacklist_characters='`"'),
                               min_size=1, max_size=12), min_size=1, max_size=4, unique=True),
       other=value)
def test_prometheus_default_matches_exactly_the_chosen_values(chosen, other):
    text = interpolate('{l=~"$v"}', PROMETHEUS, {"v": MULTI}, {"v": chosen}, {"v": chosen})
    regex = regex_of(text)
    assert all(re.fullmatch(regex, v) for v in chosen)
    assume(other not in chosen)
    assert not re.fullmatch(regex, other)


def test_all_is_the_all_value_unformatted_or_every_option():
    opts = ["gpu-a.x", "gpu-b.x"]
    assert format_value(MULTI_STAR, ALL, opts, "regex", PYROSCOPE) == ".*"
    assert format_value(MULTI_STAR, ALL, opts, None, PROMETHEUS) == ".*"
    assert format_value(MULTI, ALL, opts, "regex", PYROSCOPE) == r"(gpu-a\.x|gpu-b\.x)"
    assert format_value(MULTI, ALL, opts, None, PROMETHEUS) == r"(gpu-a\\.x|gpu-b\\.x)"
    assert format_value(MULTI, ALL, opts, None, PYROSCOPE) == "{gpu-a.x,gpu-b.x}"     # Grafana's glob
    assert format_value(MULTI, ["a"], opts, None, PYROSCOPE) == "a"
    assert format_value(MULTI, ["a", "b"], opts, "pipe", PYROSCOPE) == "a|b"
    assert format_value(SINGLE, "it's", opts, None, PROMETHEUS) == "it\\\\'s"
    with pytest.raises(ValueError):
        format_value(SINGLE, ALL, opts, None, PROMETHEUS)


def test_grafana_variable_syntaxes_and_builtins():
    v = {"node": MULTI, "rank": MULTI_STAR}
    sel = {"node": ["a", "b"], "rank": ALL}
    text = interpolate('x{h=~"$node", r=~"${rank}", g=~"[[node]]", p=~`${node:regex}`}[$__rate_interval]',
                       PROMETHEUS, v, sel, {"node": ["a", "b"]}, {"__rate_interval": "1m"})
    assert text == 'x{h=~"(a|b)", r=~".*", g=~"(a|b)", p=~`(a|b)`}[1m]'
    with pytest.raises(KeyError, match=r"\$missing"):
        interpolate("$missing", PROMETHEUS, v, sel, {})
    # the longest name wins; a `$` before a non-word character is no variable
    w = {"rank": SINGLE, "rank_b": SINGLE}
    assert interpolate('$rank_b $rank x{a=~"^b$"}', PROMETHEUS, w, {"rank": "1", "rank_b": "0"}, {}) == \
        '0 1 x{a=~"^b$"}'


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=20))
def test_parse_selector_reads_go_quoted_strings(text):
    """json.dumps (non-ASCII kept) writes escapes Go (and PromQL) read the same way."""
    assert parse_selector("{a=" + json.dumps(text, ensure_ascii=False) + "}") == [("a", "=", text)]
    if "`" not in text:
        assert parse_selector("{a!~`" + text + "`}") == [("a", "!~", text)]


@pytest.mark.parametrize("bad", ['{a="x\\.y"}', '{a="x}', '{a=x}', '{a="x" b="y"}', 'a="x"', '{a="\\x4"}',
                                 '{a="\\ud800"}', '{a="\\xff"}', "{a='\\\"'}"])
def test_parse_selector_rejects_what_promql_rejects(bad):
    with pytest.raises(ValueError):
        parse_selector(bad)


@settings(max_examples=15, deadline=None)
@given(chosen=values)
def test_prometheus_3_parses_the_interpolated_pyroscope_selector_the_same_way(chosen):
    if not os.access(PROMTOOL3, os.X_OK):
        pytest.skip("Prometheus 3's promtool is not installed (.ci/install.sh installs it)")
    text = interpolate("{l=~`${v:regex}`}", PYROSCOPE, {"v": MULTI}, {"v": chosen}, {"v": chosen})
    done = subprocess.run([PROMTOOL3, "--experimental", "promql", "format", '{__name__="x", ' + text[1:]],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert [m for m in parse_selector(done.stdout.strip()) if m[0] != "__name__"] == parse_selector(text)


def test_escape_regex_is_grafanas():
    assert escape_regex("a.b/c(d)|e$^*+?[]{}\\") == "a\\.b\\/c\\(d\\)\\|e\\$\\^\\*\\+\\?\\[\\]\\{\\}\\\\"


def test_byte_escapes_make_utf8():
    assert parse_selector('{a="\\xc3\\xa9\\303\\251\\u00e9"}') == [("a", "=", "ééé")]
