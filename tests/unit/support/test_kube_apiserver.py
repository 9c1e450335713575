"""The stand-in API server that Helm's install talks to (tests/support/kube_apiserver.py): discovery,
objects created, read back and listed by label, the release Secret that client-go sends as protobuf."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.support.kube_apiserver import ApiServer


def _call(server: ApiServer, method: str, path: str, body: bytes | None = None, kind: str = "application/json") -> Any:
    request = urllib.request.Request(server.url + path, data=body, method=method, headers={"Content-Type": kind})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (sizes under 128 bytes: one-byte varints)."""
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_discovery_names_the_kinds_a_chart_may_use() -> None:
    with ApiServer() as server:
        groups = {g["name"] for g in _call(server, "GET", "/apis")["groups"]}
        assert {"apps", "policy", "monitoring.coreos.com"} <= groups
        kinds = {r["kind"] for r in _call(server, "GET", "/apis/monitoring.coreos.com/v1")["resources"]}
        assert kinds == {"ServiceMonitor", "PrometheusRule"}
        assert _call(server, "GET", "/version")["gitVersion"].startswith("v1.")


def test_objects_are_recorded_read_back_and_listed_by_label() -> None:
    with ApiServer() as server:
        base = "/api/v1/namespaces/ns/configmaps"
        for name, team in (("a", "x"), ("b", "y")):
            obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": {"team": team}}}
            _call(server, "POST", base, json.dumps(obj).encode())
        assert _call(server, "GET", f"{base}/a")["metadata"]["namespace"] == "ns"
        assert [o["metadata"]["name"] for o in _call(server, "GET", f"{base}?labelSelector=team%3Dy")["items"]] == ["b"]
        assert [o["metadata"]["name"] for o in server.created] == ["a", "b"]
        with pytest.raises(urllib.error.HTTPError) as twice:
            _call(server, "POST", base, json.dumps({"metadata": {"name": "a"}}).encode())
        assert twice.value.code == 409
        with pytest.raises(urllib.error.HTTPError) as missing:
            _call(server, "GET", "/apis/example.com/v1/namespaces/ns/widgets/w")  # a kind without its CRD
        assert missing.value.code == 404


def test_a_protobuf_secret_is_stored_as_the_object_it_stands_for() -> None:
    meta = _field(1, b"sh.helm.release.v1.r.v1") + _field(11, _field(1, b"owner") + _field(2, b"helm"))
    secret = (
        _field(1, meta)
        + _field(2, _field(1, b"release") + _field(2, b"\x00\xffdata"))
        + _field(3, b"helm.sh/release.v1")
    )
    envelope = b"k8s\x00" + _field(1, _field(1, b"v1") + _field(2, b"Secret")) + _field(2, secret)
    with ApiServer() as server:
        _call(server, "POST", "/api/v1/namespaces/ns/secrets", envelope, "application/vnd.kubernetes.protobuf")
        (stored,) = server.created
        assert stored["metadata"] == {"name": "sh.helm.release.v1.r.v1", "namespace": "ns", "labels": {"owner": "helm"}}
        assert stored["data"] == {"release": "AP9kYXRh"} and stored["type"] == "helm.sh/release.v1"
        listed = _call(server, "GET", "/api/v1/namespaces/ns/secrets?labelSelector=owner%3Dhelm")["items"]
        assert [s["metadata"]["name"] for s in listed] == ["sh.helm.release.v1.r.v1"]
