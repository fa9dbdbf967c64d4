"""Property test of the PromQL client against any answer a server may give: a loopback HTTP
server answers each query with a Hypothesis-generated body and status; the client returns
Series with numbers exactly as sent, or one PromError line, never another exception."""
from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.promql import PromClient, PromError


class _Answer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True   # else each answer on the kept-alive connection waits ~40 ms
    status, body = 200, b"{}"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        cls = type(self)
        self.send_response(cls.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(cls.body)))
        self.end_headers()
        self.wfile.write(cls.body)

    do_GET = do_POST

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    client = PromClient(f"http://127.0.0.1:{srv.server_address[1]}", timeout=5)
    yield client
    client.close()
    srv.shutdown()
    srv.server_close()


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
                      st.text(max_size=6), st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "12.5", "x"]))
json_any = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                           st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=10)
value_text = st.one_of(st.floats().map(repr), st.sampled_from(["NaN", "+Inf", "-Inf", "1", "x", ""]))
sample = st.tuples(st.floats(0, 2e9), value_text).map(list)
series = st.fixed_dictionaries({"metric": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
                                "value": sample})
vector = st.fixed_dictionaries({"resultType": st.just("vector"), "result": st.lists(series, max_size=3)})
data = st.one_of(vector, json_any, st.fixed_dictionaries({"resultType": st.sampled_from(["vector", "matrix", "scalar",
                                                                                         "string"]),
                                                          "result": json_any}))
answers = st.one_of(
    st.fixed_dictionaries({"status": st.just("success"), "data": data}),
    st.fixed_dictionaries({"status": st.sampled_from(["error", "success", 3]), "errorType": json_any, "error": json_any}),
    json_any)


def _expected_float(text: str) -> float:
    return float(text)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answers, st.sampled_from([200, 400, 422, 500, 503]), st.booleans())
def test_any_answer_is_series_or_one_promerror_line(server, answer, status, not_json):
    _Answer.status = status
    _Answer.body = b"<html>oops" if not_json else json.dumps(answer).encode()
    try:
        result = server.query("up")
    except PromError as exc:
        assert "\n" not in str(exc)
        return
    assert status == 200 and not not_json
    sent = answer["data"]["result"]
    assert len(result) == len(sent)
    for got, raw in zip(result, sent):
        assert got.labels == raw["metric"]
        t, v = raw["value"]
        assert got.points[0][0] == t
        want = _expected_float(v)
        assert (math.isnan(got.value) and math.isnan(want)) or got.value == want


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(json_any, st.lists(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2), max_size=3),
                 st.lists(st.text(max_size=4), max_size=3)))
def test_series_and_label_values_of_any_answer_are_typed_or_one_line(server, data):
    _Answer.status, _Answer.body = 200, json.dumps({"status": "success", "data": data}).encode()
    for call in (lambda: server.series("up"), lambda: server.label_values("job")):
        try:
            got = call()
        except PromError as exc:
            assert "\n" not in str(exc)
            continue
        assert isinstance(got, list)
        assert all(isinstance(x, dict) and all(isinstance(v, str) for v in x.values()) or isinstance(x, str)
                   for x in got)
