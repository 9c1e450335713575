"""The bridge's MQTT TLS, built by mqtt/ as the agent's: mqtts:// verifies the broker against
--mqtt.tls.ca-file, a client certificate passes a broker that requires one, and a TLS file that does not
load is one line (a real Mosquitto with require_certificate, certificates made by openssl)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.service import Bridge
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.config import ConfigError
from tests.support.mosquitto import Broker, make_tls

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def mtls(tmp_path: Path) -> Iterator[tuple[Broker, dict[str, str]]]:
    tls = make_tls(tmp_path / "pki")
    broker = Broker(tmp_path / "mqtt", tls={**tls, "require_certificate": "true"})
    broker.start()
    yield broker, tls
    broker.stop()


def _connects(url: str, within: float, **files: str) -> bool:
    """Whether a bridge with these TLS files connects and subscribes within ``within`` seconds."""
    settings = BridgeSettings(mqtt_url=url, remote_write_url="http://127.0.0.1:9/api/v1/write", **files)
    bridge = Bridge(settings, CollectorRegistry())
    bridge.start()
    try:
        return bridge.wait_connected(within)
    finally:
        bridge.stop(timeout=5.0)


def test_a_client_certificate_passes_a_broker_that_requires_one(mtls: tuple[Broker, dict[str, str]]) -> None:
    broker, tls = mtls
    assert broker.url.startswith("mqtts://")
    files = {"mqtt_ca_file": tls["ca"], "mqtt_cert_file": tls["client_cert"], "mqtt_key_file": tls["client_key"]}
    assert _connects(broker.url, 15, **files)
    assert not _connects(broker.url, 3, mqtt_ca_file=tls["ca"])  # the same bridge without it is refused


def test_a_broker_the_ca_file_did_not_sign_is_refused(mtls: tuple[Broker, dict[str, str]], tmp_path: Path) -> None:
    broker, tls = mtls
    other = make_tls(tmp_path / "other-pki")
    files = {"mqtt_cert_file": tls["client_cert"], "mqtt_key_file": tls["client_key"]}
    assert not _connects(broker.url, 3, mqtt_ca_file=other["ca"], **files)


def test_a_tls_file_that_does_not_load_is_one_line(tmp_path: Path) -> None:
    settings = BridgeSettings(
        mqtt_url="mqtts://127.0.0.1:8883",
        remote_write_url="http://127.0.0.1:9/api/v1/write",
        mqtt_ca_file=str(tmp_path / "missing.crt"),
    )
    with pytest.raises(ConfigError) as raised:
        Bridge(settings, CollectorRegistry())
    assert str(raised.value) == f"--mqtt.tls.ca-file={tmp_path / 'missing.crt'}: cannot load: No such file or directory"
