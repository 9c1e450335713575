"""The bridge and the agent against a second MQTT broker implementation: aedes (npm), real, on 127.0.0.1.

aedes 1.2 speaks MQTT 3.1.1, not MQTT 5. The agent forwards through it with ``--mqtt.protocol=3.1.1``
(every sequence number arrives); the bridge, which needs MQTT 5 (session expiry, Receive Maximum,
Maximum Packet Size, shared subscriptions), says in one line that the broker does not speak it, and
/readyz gives that reason, instead of a warning pair per attempt about an "Unsupported protocol version".
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gpu_exporter.payload import decode
from tests.support import Exporter, free_port, spawn_logged, wait_until
from tests.support.aedes import AedesServer
from tests.support.procs import http_get, stop_process

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class Seqs:
    """An MQTT 3.1.1 subscriber (persistent session, QoS 1) keeping every sequence number received."""

    def __init__(self, port: int) -> None:
        self.got: list[int] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=f"seqs-{uuid.uuid4().hex[:8]}",
            protocol=MQTTProtocolVersion.MQTTv311,
            clean_session=False,
        )
        self.client.on_connect = lambda c, *a: c.subscribe("gpu-exporter/+/batch", 1)
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()
        assert self._subscribed.wait(10), "the subscriber could not subscribe on aedes"

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        batch = decode(msg.payload)
        if batch.health:  # the agent's health report: a stream of its own, no GPU samples
            return
        with self._lock:
            self.got += [s.seq for s in batch.samples]

    def seqs(self) -> list[int]:
        with self._lock:
            return list(self.got)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


def test_the_agent_forwards_through_aedes_on_mqtt_3_1_1(tmp_path: Path) -> None:
    broker = AedesServer(tmp_path / "aedes")
    broker.start()
    exporter = None
    try:
        sub = Seqs(broker.port)
        exporter = Exporter(
            "--gpu-vendor=fake",
            "--fake.gpus=1",
            "--gpu-metrics-collection-interval=200ms",
            "--node-name=edge-aedes",
            f"--mqtt.url={broker.url}",
            "--mqtt.protocol=3.1.1",
            f"--spool.dir={tmp_path / 'spool'}",
            "--mqtt.batch-interval=500ms",
        ).start()
        wait_until(lambda: len(sub.seqs()) >= 20, 30, "20 samples through aedes")
        exporter.stop(signal.SIGTERM)  # a clean stop publishes the open batch
        exporter = None
        time.sleep(1.0)
        got = sub.seqs()
        sub.close()
        assert sorted(got) == list(range(min(got), max(got) + 1)), "a sequence number missing or twice"
    finally:
        if exporter is not None:
            exporter.stop()
        broker.stop()
    assert "aedes 1." in broker.log() and f"aedes {broker.version}" in broker.log()


def test_the_bridge_says_in_one_line_that_the_broker_lacks_mqtt_5(tmp_path: Path) -> None:
    broker = AedesServer(tmp_path / "aedes")
    broker.start()
    port = free_port()
    log = tmp_path / "bridge.log"
    bridge = spawn_logged(
        log,
        "bridge",
        f"--mqtt.url={broker.url}",
        "--remote-write.url=http://127.0.0.1:1/api/v1/write",
        "--bridge.client-id=bridge-on-aedes",
        f"--bridge.listen-address=127.0.0.1:{port}",
    )
    try:
        wait_until(lambda: "does not speak MQTT 5" in log.read_text(), 20, "the bridge's line")
        status, body, _ = http_get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503
        assert b"does not speak MQTT 5" in body, body
        time.sleep(4.0)  # paho retries after 1 s, 2 s: still one line, and the bridge runs on
        assert bridge.poll() is None
        text = log.read_text()
        assert text.count("does not speak MQTT 5") == 1, text
        assert "Traceback" not in text and "disconnected from MQTT broker" not in text, text
        assert "point --mqtt.url at an MQTT 5 broker" in text
        assert "unacceptable protocol version" in broker.log()  # aedes refused it, as the bridge says
    finally:
        stop_process(bridge)
        broker.stop()
    assert bridge.returncode == 0
