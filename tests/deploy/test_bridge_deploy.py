"""deploy/bridge.yaml: valid Kubernetes, two replicas in one shared subscription, arguments the bridge
accepts, and the hardening the project asks of every pod."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter import config as cfg
from gpu_exporter.bridge import cli
from tests.support import paths
from tests.support.pod_security import restricted_violations

MANIFEST = paths.ROOT / "deploy" / "bridge.yaml"


def _docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if d]


def _deployment() -> dict[str, Any]:
    return next(d for d in _docs() if d["kind"] == "Deployment")


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in _docs():
        kubernetes_validate.validate(doc, "1.30.0", strict=True)


def test_two_replicas_share_one_subscription_each_under_its_own_stable_session() -> None:
    dep = _deployment()
    assert dep["spec"]["replicas"] == 2
    container = dep["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[0] == "bridge"
    assert any(a.startswith("--bridge.group=") for a in args)
    assert "--bridge.client-id=$(POD_NAME)" in args
    pod_name = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert pod_name["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_arguments_are_a_valid_bridge_configuration(tmp_path: Path) -> None:
    secret = "/etc/gpu-exporter-bridge/mqtt/password"
    (tmp_path / "password").write_text("from-the-secret\n")
    args = [
        a.replace("$(POD_NAME)", "gpu-exporter-bridge-abc12").replace(secret, str(tmp_path / "password"))
        for a in _deployment()["spec"]["template"]["spec"]["containers"][0]["args"][1:]
    ]
    parsed = cli.build_parser().parse_args(args)
    env = {"GPU_EXPORTER_MQTT_USERNAME": "gpu-exporter-bridge"}  # from the Secret, as the manifest says
    settings = cli.settings_from(cfg.load(vars(parsed), environ=env))
    assert settings.group and settings.client_id == "gpu-exporter-bridge-abc12"
    assert settings.session_expiry >= 3600
    assert settings.mqtt_password == b"from-the-secret"  # the cloud broker has no anonymous listener


def test_the_bridge_authenticates_with_a_secret_it_cannot_start_without() -> None:
    container = _deployment()["spec"]["template"]["spec"]["containers"][0]
    user = next(e for e in container["env"] if e["name"] == "GPU_EXPORTER_MQTT_USERNAME")
    assert not user["valueFrom"]["secretKeyRef"].get("optional", False)
    volumes = {v["name"]: v for v in _deployment()["spec"]["template"]["spec"]["volumes"]}
    assert not volumes["mqtt-secret"]["secret"].get("optional", False)


def test_probes_ask_the_bridges_own_questions() -> None:
    """Readiness is /readyz, which is 503 while the bridge cannot read from its broker or write to its
    TSDB (so the Service stops sending it work); liveness is /healthz, which answers while the HTTP
    server runs and does not flap with the broker (a restart would not bring the broker back). Both on
    the port the bridge listens on, outside any basic auth of /metrics."""
    container = _deployment()["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    listen = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--bridge.listen-address=")]
    listen_port = int(listen[-1].rsplit(":", 1)[1]) if listen else 9401  # the option's default
    for probe in ("livenessProbe", "readinessProbe"):
        port = container[probe]["httpGet"]["port"]
        assert ports.get(port, port) == listen_port, probe


# What the bridge's memory is made of (docs/bridge.md, "Bounds on series and node names"): the process;
# per series counted against --bridge.max-series, as a flood of invented series costs it (each with label
# values of its own: bench/bench_bridge_attack.py --only seriesfleet, the bridge's peak RSS over its RSS
# before, per series; a real node's series cost less); the payloads it holds unacknowledged; a message
# being parsed and a write group decoded and encoded; the per-device bookkeeping, bounded by
# --bridge.series-cache in units of about 300 bytes (bridge/convert.py), which a flood of devices fills. A limit below their sum is an OOM kill the moment
# a flood fills the budget, and a restarted bridge meets the same flood in its session.
PROCESS_BYTES = 64 << 20
FLOOD_BYTES_PER_SERIES = 400  # measured 352 at the 1,500,000 default (docs/bridge.md, "Under attack")
WORKING_BYTES = 100 << 20
CACHE_UNIT_BYTES = 300
HEADROOM = 1.2


def _quantity(text: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1000, "M": 1000**2, "G": 1000**3}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def test_the_memory_limit_holds_the_series_budget_a_flood_can_fill(tmp_path: Path) -> None:
    container = _deployment()["spec"]["template"]["spec"]["containers"][0]
    (tmp_path / "password").write_text("p\n")
    args = [
        a.replace("$(POD_NAME)", "bridge-0").replace(
            "/etc/gpu-exporter-bridge/mqtt/password", str(tmp_path / "password")
        )
        for a in container["args"][1:]
    ]
    env = {"GPU_EXPORTER_MQTT_USERNAME": "gpu-exporter-bridge"}
    settings = cli.settings_from(cfg.load(vars(cli.build_parser().parse_args(args)), environ=env))
    series = settings.max_series * FLOOD_BYTES_PER_SERIES
    devices = settings.series_cache * CACHE_UNIT_BYTES
    need = PROCESS_BYTES + series + devices + settings.max_inflight_bytes + WORKING_BYTES
    limit = _quantity(container["resources"]["limits"]["memory"])
    assert limit >= need * HEADROOM, f"{limit >> 20} MiB for {settings.max_series:,} series: {need >> 20} MiB"
    assert settings.max_series >= 1000 * 888  # the default covers 1,000 8-GPU nodes (health reports included)


def test_pod_is_hardened() -> None:
    spec = _deployment()["spec"]["template"]["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    sc = spec["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "limits" in spec["containers"][0]["resources"]


def test_pod_meets_the_restricted_pod_security_standard() -> None:
    """The bridge runs in a namespace that enforces `restricted` (unlike the agent: hostNetwork, hostPath)."""
    assert restricted_violations(_deployment()["spec"]["template"]["spec"]) == []


def test_the_restricted_check_refuses_what_the_profile_refuses() -> None:
    agent = yaml.safe_load((paths.ROOT / "deploy" / "base" / "daemonset.yaml").read_text(encoding="utf-8"))
    found = " | ".join(restricted_violations(agent["spec"]["template"]["spec"]))
    for rule in ("hostNetwork", "volume spool", "hostPort", "spool-owner: runAsNonRoot", "capabilities add ['CHOWN']"):
        assert rule in found, rule
