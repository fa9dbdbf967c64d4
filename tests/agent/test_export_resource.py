"""The agent's resource attributes without the OTel SDK equal the SDK's, whatever the environment."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.export import resource_attributes_without_sdk
from otel_gpu.export_sdk import merged_resource

OURS = {"host.name": "node-1", "service.instance.id": "5f0c6a53-0000-4c55-9d0e-6f7a0c6b1e42",
        "service.name": "otel-gpu-agent", "otelgpu.job": "llama"}
_chars = st.sampled_from(list("ab.=,% _-2F0") + ["%20", "%2C", "host.name", "service.name", "otelgpu.job"])
_text = st.lists(_chars, max_size=12).map("".join)


@settings(max_examples=300, deadline=None)
@given(attributes=st.one_of(st.none(), _text), service=st.one_of(st.none(), _text))
def test_same_attributes_as_the_sdk(attributes, service):
    env = {}
    if attributes is not None:
        env["OTEL_RESOURCE_ATTRIBUTES"] = attributes
    if service is not None:
        env["OTEL_SERVICE_NAME"] = service
    saved = {k: os.environ.pop(k) for k in ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME",
                                            "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS") if k in os.environ}
    os.environ.update(env)   # the SDK reads os.environ itself
    try:
        sdk = dict(merged_resource(OURS).attributes)
    finally:
        for k in env:
            os.environ.pop(k, None)
        os.environ.update(saved)
    assert resource_attributes_without_sdk(OURS, env) == sdk


def test_other_detectors_need_the_sdk():
    assert resource_attributes_without_sdk(OURS, {"OTEL_EXPERIMENTAL_RESOURCE_DETECTORS": "otel,process"}) is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_prometheus_only_agent_never_loads_the_sdk():
    """The agent's set-up without an OTLP endpoint imports no OTel SDK module, nor http.client and
    ssl (the scrape endpoint is built on socketserver): ~9 MB of a long-running process; nor
    OpenSSL's hashes (~3.7 MB, for one UUIDv5), `statistics` (`decimal`, `fractions`) or psutil
    (~1.7 MB; /proc answers its calls)."""
    code = ("import sys, os\n"
            "from otel_gpu.agent.cli import agent_config, register\n"
            "import argparse\n"
            "p = argparse.ArgumentParser(); sub = p.add_subparsers(); register(sub)\n"
            f"args = p.parse_args(['agent', '--no-live', '--fake-gpus', '2', '--prometheus-port', '{free_port()}'])\n"
            "cfg = agent_config(args, {}, False)\n"
            "from otel_gpu.agent.node import build_node\n"
            "from otel_gpu.agent.runtime import AgentRuntime\n"
            "node = build_node(cfg.node)\n"
            "try:\n"
            "    AgentRuntime(cfg, node)\n"
            "except Exception as exc:\n"
            "    print('runtime:', type(exc).__name__)\n"
            "node.close()\n"
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk.metrics', 'opentelemetry.sdk.resources',\n"
            "      'opentelemetry.metrics', 'opentelemetry.exporter', 'ssl', 'http.client', 'http.server',\n"
            "      '_hashlib', 'statistics', 'decimal', 'psutil'))))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
