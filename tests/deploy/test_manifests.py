"""deploy/: the plain manifests and the Helm chart (default and custom values) validated offline against
the Kubernetes API schemas (kubernetes-validate, strict: unknown fields fail), the ServiceMonitor against
the CRD fields it uses, the chart's default render equal to the plain manifests, least privilege held."""
from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from .chart_render import TemplateError, render_chart, render_text
from .servicemonitor_schema import SCHEMA

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (.ci/install.sh does)")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CHART = DEPLOY / "helm" / "otel-gpu-agent"
K8S_VERSION = "1.30.0"
CUSTOM = {"otlpEndpoint": "http://otel-collector.monitoring:4318", "podResources": {"enabled": True},
          "serviceMonitor": {"enabled": False}, "interval": "0.5", "port": 9500,
          "image": {"tag": "0.2.0"}, "resources": {"limits": {"memory": "1Gi"}}}


def plain() -> list[dict]:
    return [d for f in sorted((DEPLOY / "kubernetes").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def validate(docs: list[dict]) -> None:
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SCHEMA)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def container(docs: list[dict]) -> dict:
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c


@pytest.mark.parametrize("source", ["plain", "chart default", "chart custom"])
def test_manifests_are_valid_and_least_privilege(source):
    docs = {"plain": plain, "chart default": lambda: render_chart(CHART, "monitoring"),
            "chart custom": lambda: render_chart(CHART, "gpu-monitoring", CUSTOM)}[source]()
    validate(docs)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    c = container(docs)
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert pod["hostPID"] is True and pod["automountServiceAccountToken"] is False
    host_paths = {v["name"] for v in pod["volumes"] if "hostPath" in v}
    assert all(m["readOnly"] for m in c["volumeMounts"] if m["name"] in host_paths)   # every host path read-only
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OTELGPU_PROMETHEUS_HOST"] == "$(POD_IP)"   # never 0.0.0.0


def test_chart_default_renders_the_plain_manifests():
    assert sorted(render_chart(CHART, "monitoring"), key=repr) == sorted(plain(), key=repr)


def test_chart_custom_values_reach_the_objects():
    docs = render_chart(CHART, "gpu-monitoring", CUSTOM)
    assert {d["kind"] for d in docs} == {"ServiceAccount", "DaemonSet", "Service"}   # no ServiceMonitor
    assert all(d["metadata"]["namespace"] == "gpu-monitoring" for d in docs)
    c = container(docs)
    assert c["image"] == "registry.example.com/otel-gpu:0.2.0"
    assert c["args"][-4:] == ["--interval", "0.5", "--prometheus-port", "9500"]
    assert {"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://otel-collector.monitoring:4318"} in c["env"]
    assert {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources", "readOnly": True} in c["volumeMounts"]
    assert {"name": "OTELGPU_KUBELET_SOCKET", "value": "/var/lib/kubelet/pod-resources/kubelet.sock"} in c["env"]
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}
    (svc,) = [d for d in docs if d["kind"] == "Service"]
    assert svc["spec"]["ports"][0]["port"] == 9500


def test_invalid_objects_are_refused():
    docs = render_chart(CHART, "monitoring")
    bad = yaml.safe_load(yaml.safe_dump(docs))
    container(bad)["securityContext"]["privilegd"] = True   # a typo: strict validation fails
    with pytest.raises(kubernetes_validate.ValidationError):
        validate([d for d in bad if d["kind"] == "DaemonSet"])
    (sm,) = [d for d in bad if d["kind"] == "ServiceMonitor"]
    sm["spec"]["endpoints"][0]["intervall"] = "10s"
    with pytest.raises(jsonschema.ValidationError):
        validate([sm])


def test_the_renderer_refuses_what_it_does_not_understand():
    ctx = {"Values": {"a": "x", "on": True}}
    assert render_text("k: {{ .Values.a | quote }}\n{{- if .Values.on }}\nb: 1\n{{- end }}\n", ctx) == 'k: "x"\nb: 1\n'
    for text in ("{{ include \"x\" . }}", "{{ .Values.missing }}", "{{ if .Values.a }}", "{{ .Values.a -}}"):
        with pytest.raises(TemplateError):
            render_text(text, ctx)
