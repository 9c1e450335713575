"""deploy/components/web-tls and deploy/servicemonitor-https.yaml: HTTPS, basic auth and the probes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.test_deploy import DEPLOY, K8S_VERSION, _agent, render_with


def test_web_tls_component_serves_https_and_keeps_probes_working(tmp_path: Path) -> None:
    docs = render_with(tmp_path, "web-tls")
    agent = _agent(docs)
    assert "--web.config.file=/etc/gpu-exporter-web/web.yml" in agent["args"]
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == "/etc/gpu-exporter-web")
    assert mount["readOnly"] is True
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert agent[probe]["httpGet"] == {"path": path, "port": "metrics", "scheme": "HTTPS"}
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_https_service_monitor_uses_tls_and_basic_auth() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "servicemonitor-https.yaml").read_text(encoding="utf-8")) if d]
    (monitor,) = docs
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"]["key"] == "ca.crt"
    assert endpoint["basicAuth"]["password"] == {"name": "gpu-exporter-scrape", "key": "password"}
