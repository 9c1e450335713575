"""Two real bridges on one real Mosquitto. With the default client id (unique per process) they both stay
connected and both write; with one client id given to both, the broker lets one connection hold it and
they knock each other off: the bridges say so (a takeover of the session, with the client id), not just
"disconnected"."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpu_exporter.payload import encode
from tests.support.bridge_helpers import BridgeProcess, Publisher, ScriptedReceiver, make_batch
from tests.support.tsdb import MosquittoServer, mosquitto_fixture, wait_until

broker = mosquitto_fixture()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _ok(n: int) -> tuple[int, bytes, dict[str, str]]:
    return 204, b"", {}


def _default_id(bridge: BridgeProcess) -> BridgeProcess:
    bridge.args = [a for a in bridge.args if not a.startswith("--bridge.client-id=")]
    return bridge


def _nodes_written(rx: ScriptedReceiver) -> set[str]:
    return {dict(labels)["node"] for r in rx.requests for labels, _ in r.series}


def test_two_bridges_with_the_default_client_id_on_one_host_both_stay_connected(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    with ScriptedReceiver(_ok) as rx_a, ScriptedReceiver(_ok) as rx_b:
        a = _default_id(BridgeProcess(tmp_path / "a", broker, rx_a.url, "unused-a"))
        b = _default_id(BridgeProcess(tmp_path / "b", broker, rx_b.url, "unused-b"))
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        pub = None
        try:
            a.start()
            b.start()
            pub = Publisher(broker.port, client_id="two-bridges")
            t = time.time() - 60
            for i in range(5):  # a plain subscription each: both get every batch
                pub.publish(f"gpu-exporter/edge-{i}/batch", encode(make_batch(f"edge-{i}", "b", [1], t)))
            want = {f"edge-{i}" for i in range(5)}
            wait_until(lambda: _nodes_written(rx_a) == want and _nodes_written(rx_b) == want, 60, "both write")
            for bridge in (a, b):
                assert bridge.metric("gpu_exporter_bridge_mqtt_connected") == 1
                log = bridge.log.read_text()
                assert "disconnected" not in log and "taken over" not in log, log
                assert "no --bridge.client-id: connecting as 'gpu-exporter-bridge-" in log
            ids = {line.split("no --bridge.client-id: connecting as ")[1].split("'")[1] for line in _lines(a, b)}
            assert len(ids) == 2
        finally:
            if pub is not None:
                pub.close()
            a.stop()
            b.stop()


def _lines(*bridges: BridgeProcess) -> list[str]:
    return [
        line
        for b in bridges
        for line in b.log.read_text().splitlines()
        if "no --bridge.client-id: connecting as" in line
    ]


def test_two_bridges_given_one_client_id_log_the_takeover_of_their_session(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    with ScriptedReceiver(_ok) as rx:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        a = BridgeProcess(tmp_path / "a", broker, rx.url, "bridge-twin")
        b = BridgeProcess(tmp_path / "b", broker, rx.url, "bridge-twin")
        try:
            a.start()
            b.start()  # takes the session; a reconnects and takes it back; and so on
            wait_until(
                lambda: "MQTT session taken over" in a.log.read_text() + b.log.read_text(), 60, "a takeover logged"
            )
            line = next(
                ln for ln in (a.log.read_text() + b.log.read_text()).splitlines() if "MQTT session taken over" in ln
            )
            assert "another client connected with this bridge's client id 'bridge-twin'" in line
            assert "--bridge.client-id" in line
            counted = sum(
                x.metric(f'gpu_exporter_bridge_session_takeovers_total{{evidence="{e}"}}')
                for x in (a, b)
                for e in ("reason", "pattern")
            )
            assert counted >= 1
        finally:
            a.stop()
            b.stop()
