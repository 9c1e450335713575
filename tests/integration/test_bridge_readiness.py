"""The bridge's /readyz tells the truth: 503 with the reason once the real Mosquitto it reads from has been
stopped (by PID), or remote writes have failed, for --bridge.readiness-timeout; 200 again once the
broker is back or a write goes through. The agent's readiness is another matter (docs/bridge.md)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from gpu_exporter.payload import encode
from tests.support.bridge_helpers import BridgeProcess, Publisher, ScriptedReceiver, make_batch
from tests.support.procs import http_get
from tests.support.tsdb import MosquittoServer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TIMEOUT = "--bridge.readiness-timeout=3s"


def _readyz(bridge: BridgeProcess) -> tuple[int, str]:
    status, body, _ = http_get(f"http://127.0.0.1:{bridge.port}/readyz")
    return status, body.decode().strip()


def test_readyz_is_503_while_the_broker_is_stopped_and_200_once_it_is_back(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    broker.start()
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        bridge = BridgeProcess(tmp_path, broker, rx.url, "ready-broker", TIMEOUT)
        try:
            bridge.start()
            assert _readyz(bridge) == (200, "ready")
            broker.stop()  # SIGTERM by PID
            _, why = wait_until(lambda: (r := _readyz(bridge))[0] == 503 and r, 30, "/readyz 503")
            assert f"MQTT broker 127.0.0.1:{broker.port} unreachable for" in why
            seconds = float(why.split("unreachable for ")[1].split("s")[0])
            assert seconds >= 3  # not before the bound: a reconnection is no outage
            broker.start()  # the same port
            wait_until(lambda: _readyz(bridge) == (200, "ready"), 60, "/readyz 200 again")
            assert bridge.metric("gpu_exporter_bridge_mqtt_connected") == 1
        finally:
            bridge.stop()
            broker.stop()


def test_readyz_is_503_while_remote_writes_fail_and_200_once_one_goes_through(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    broker.start()
    failing = threading.Event()
    failing.set()

    def answer(n: int) -> tuple[int, bytes, dict[str, str]]:
        return (503, b"overloaded", {}) if failing.is_set() else (204, b"", {})

    with ScriptedReceiver(answer) as rx:
        bridge = BridgeProcess(tmp_path, broker, rx.url, "ready-writes", TIMEOUT)
        pub = None
        try:
            bridge.start()
            assert _readyz(bridge) == (200, "ready")
            pub = Publisher(broker.port, client_id="ready-publisher")
            pub.publish("gpu-exporter/edge-1/batch", encode(make_batch("edge-1", "b", [1, 2], time.time() - 60)))
            _, why = wait_until(lambda: (r := _readyz(bridge))[0] == 503 and r, 60, "/readyz 503")
            assert f"remote writes to {rx.url} failing for" in why and "HTTP 503" in why
            failing.clear()
            wait_until(lambda: _readyz(bridge) == (200, "ready"), 60, "/readyz 200 again")
            assert bridge.metric("gpu_exporter_bridge_samples_written_total") > 0
        finally:
            if pub is not None:
                pub.close()
            bridge.stop()
            broker.stop()
