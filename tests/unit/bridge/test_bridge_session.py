"""The bridge's MQTT session as /readyz and the log tell it (bridge/session.py): readiness against a
clock the test moves, and a takeover of the client id, said by the broker (MQTT 5 reason 0x8E, as paho 2
reports a DISCONNECT) or seen as a pattern (Mosquitto before 2.0.15 closes without a reason); a refused
connection, and a broker without MQTT 5 among them, as the reason it stays."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.service import Bridge
from gpu_exporter.bridge.session import EARLY, STREAK
from tests.support.bridge_attacks import local_bridge, value
from tests.unit.bridge.test_bridge_limits import Clock

TAKEN_OVER = ReasonCode(PacketTypes.DISCONNECT, identifier=0x8E)
UNSPECIFIED = ReasonCode(PacketTypes.DISCONNECT, "Unspecified error")
NORMAL = ReasonCode(PacketTypes.DISCONNECT, "Normal disconnection")
SUCCESS = ReasonCode(PacketTypes.CONNACK, "Success")


def _bridge(clock: Clock | None = None) -> tuple[Bridge, CollectorRegistry]:
    return local_bridge(
        "http://127.0.0.1:1/api/v1/write", client_id="bridge-7", readiness_timeout=30.0, clock=clock or Clock()
    )


def _flags(from_server: bool) -> mqtt.DisconnectFlags:
    return mqtt.DisconnectFlags(is_disconnect_packet_from_server=from_server)


def _connect(bridge: Bridge) -> None:
    bridge.session.connected()
    bridge.session.subscribed()


def test_ready_once_subscribed_and_unready_only_after_the_timeout_of_an_outage() -> None:
    clock = Clock()
    bridge, _ = _bridge(clock)
    ready, why = bridge.ready()
    assert not ready and why.startswith("not yet connected and subscribed to the MQTT broker 127.0.0.1:1")
    _connect(bridge)
    assert bridge.ready() == (True, "ready")
    bridge.session.lost(UNSPECIFIED.value, False, "Unspecified error")
    clock.now += 29
    assert bridge.ready() == (True, "ready")  # a reconnection is no outage
    bridge.session.failed("cannot connect")
    clock.now += 2
    ready, why = bridge.ready()
    assert not ready
    assert why == "MQTT broker 127.0.0.1:1 unreachable for 31s (cannot connect)"
    _connect(bridge)
    assert bridge.ready() == (True, "ready")


def test_a_disconnect_saying_session_taken_over_is_logged_with_the_client_id(caplog: pytest.LogCaptureFixture) -> None:
    bridge, registry = _bridge()
    _connect(bridge)
    with caplog.at_level(logging.WARNING):
        bridge._on_disconnect(bridge._client, None, _flags(True), TAKEN_OVER, None)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert "MQTT session taken over: another client connected with this bridge's client id 'bridge-7'" in lines[0]
    assert "the broker says: Session taken over" in lines[0]
    assert value(registry, "gpu_exporter_bridge_session_takeovers_total", evidence="reason") == 1
    assert "session taken over" in (bridge.session.unready(0.0) or "")


def test_connections_closed_soon_without_a_reason_again_and_again_look_like_a_takeover(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    bridge, registry = _bridge(clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(STREAK - 1):
            _connect(bridge)
            clock.now += 1
            bridge._on_disconnect(bridge._client, None, _flags(False), UNSPECIFIED, None)
        assert value(registry, "gpu_exporter_bridge_session_takeovers_total", evidence="pattern") == 0
        _connect(bridge)
        clock.now += 1
        bridge._on_disconnect(bridge._client, None, _flags(False), UNSPECIFIED, None)
    assert value(registry, "gpu_exporter_bridge_session_takeovers_total", evidence="pattern") == 1
    assert any("taken over" in r.getMessage() and "3 connections in a row" in r.getMessage() for r in caplog.records)


def test_a_network_that_drops_connections_is_no_takeover() -> None:
    clock = Clock()
    bridge, registry = _bridge(clock)
    for i in range(2 * STREAK):
        _connect(bridge)
        clock.now += EARLY + 1 if i % 2 else 1  # some connections last
        bridge._on_disconnect(bridge._client, None, _flags(False), UNSPECIFIED, None)
        if i % 3 == 2:
            bridge._on_connect_fail(bridge._client, None)  # and attempts fail
    bridge._on_disconnect(bridge._client, None, _flags(True), NORMAL, None)
    assert value(registry, "gpu_exporter_bridge_session_takeovers_total", evidence="pattern") == 0
    assert value(registry, "gpu_exporter_bridge_session_takeovers_total", evidence="reason") == 0


def test_the_default_client_id_is_the_host_and_listen_port_and_random_only_on_port_0(tmp_path: Path) -> None:
    from gpu_exporter import config as cfg
    from gpu_exporter.bridge.cli import settings_from

    base = {"mqtt.url": "mqtt://127.0.0.1:1883", "remote-write.url": "http://127.0.0.1:9090/api/v1/write"}
    host = socket.gethostname()
    # stable across restarts (the session survives one), distinct for two bridges on one host
    assert {settings_from(cfg.load(dict(base))).client_id for _ in range(3)} == {f"gpu-exporter-bridge-{host}-9401"}
    other = settings_from(cfg.load({**base, "bridge.listen-address": "127.0.0.1:9501"})).client_id
    assert other == f"gpu-exporter-bridge-{host}-9501"
    assert settings_from(cfg.load({**base, "bridge.state-dir": str(tmp_path)})).client_id == other.replace(
        "9501", "9401"
    )
    # port 0: no name to keep, so one per process, and no state directory without an explicit id
    anywhere = {**base, "bridge.listen-address": "127.0.0.1:0"}
    ids = {settings_from(cfg.load(dict(anywhere))).client_id for _ in range(3)}
    assert len(ids) == 3 and all(i.startswith(f"gpu-exporter-bridge-{host}-any-") for i in ids)
    assert settings_from(cfg.load({**base, "bridge.client-id": "bridge-0"})).client_id == "bridge-0"
    with pytest.raises(cfg.ConfigError, match=r"--bridge\.state-dir needs --bridge\.client-id"):
        settings_from(cfg.load({**anywhere, "bridge.state-dir": str(tmp_path)}))


def test_a_broker_without_mqtt_5_is_named_once_a_minute_and_stays_the_readiness_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """paho reports an MQTT 3.1.1 broker's CONNACK 1 as "Unsupported protocol version", then a disconnect."""
    clock = Clock()
    bridge, _ = _bridge(clock)
    refused = ReasonCode(PacketTypes.CONNACK, "Unsupported protocol version")
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            bridge._on_connect(bridge._client, None, None, refused, None)
            bridge._on_disconnect(bridge._client, None, _flags(False), UNSPECIFIED, None)
            clock.now += 2.0
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "does not speak MQTT 5" in lines[0] and "127.0.0.1:1" in lines[0]
    ready, why = bridge.ready()
    assert not ready and "refused: the broker does not speak MQTT 5" in why, why


def test_another_refusal_keeps_its_own_reason_past_the_disconnect_that_follows() -> None:
    bridge, _ = _bridge()
    bridge._on_connect(bridge._client, None, None, ReasonCode(PacketTypes.CONNACK, "Not authorized"), None)
    bridge._on_disconnect(bridge._client, None, _flags(False), UNSPECIFIED, None)
    assert bridge.ready()[1].endswith("(refused: Not authorized)")
