"""Per-node broker ACLs (docs/bridge.md) and the bridge's identity-from-topic rule, together, isolate
nodes: with a real Mosquitto enforcing ``pattern write gpu-exporter/%u/#``, node A can neither publish
on node B's topic (the broker refuses) nor write series for B from its own topic (the bridge refuses
and counts it, because the node is the one the topic names)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.service import Bridge
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch
from tests.support.mosquitto import MOSQUITTO_PASSWD, Broker
from tests.support.tsdb import wait_until

pytestmark = pytest.mark.integration

ACL = """\
# the bridge reads every node's topics
user bridge
topic read gpu-exporter/#

# every other user (one per node, named after the node) writes only below its own name
pattern write gpu-exporter/%u/#
"""


class NodeClient:
    """A node's MQTT 5 connection with its own credentials."""

    def __init__(self, port: int, user: str, password: str) -> None:
        import paho.mqtt.client as mqtt

        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=user, protocol=mqtt.MQTTv5)
        self.client.username_pw_set(user, password)
        self.connected = threading.Event()
        self.client.on_connect = lambda *args: self.connected.set()
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(10), f"{user} could not connect"

    def publish(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1)
        info.wait_for_publish(10)  # the broker answers a refused QoS 1 publish too (PUBACK, not authorized)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_node_a_cannot_write_node_b_series(tmp_path: Path) -> None:
    (tmp_path / "acl").write_text(ACL)
    users = {"bridge": "bridge-pw", "node-a": "a-pw", "node-b": "b-pw"}
    # (Mosquitto 2.0.11 with "max_queued_messages 0" drops the connection of a client whose publish
    # the ACL refuses, instead of answering "not authorized": the test sets a real queue limit.)
    extra = f"acl_file {tmp_path / 'acl'}\nmax_queued_messages 1000\n"
    broker = Broker(tmp_path / "mqtt", users=users, extra=extra)
    broker.start()
    now = time.time()
    forged_on_b_topic = make_batch("node-b", "forged", [1, 2], now - 100)
    forged_on_a_topic = make_batch("node-b", "forged", [3, 4], now - 90)
    own_a = make_batch("node-a", "boot-a", [1, 2], now - 20)
    own_b = make_batch("node-b", "boot-b", [1, 2], now - 10)
    registry = CollectorRegistry()
    clients: list[NodeClient] = []
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        settings = BridgeSettings(
            mqtt_url=broker.url,
            remote_write_url=rx.url,
            mqtt_username="bridge",
            mqtt_password=b"bridge-pw",
            client_id="acl-bridge",
            rw_backoff_max=0.2,
        )
        bridge = Bridge(settings, registry)
        bridge.start()
        try:
            assert bridge.wait_connected(10), "bridge did not connect"
            a = NodeClient(broker.port, "node-a", "a-pw")
            b = NodeClient(broker.port, "node-b", "b-pw")
            clients += [a, b]
            a.publish("gpu-exporter/node-b/batch", encode(forged_on_b_topic))  # the broker's ACL refuses it
            a.publish("gpu-exporter/node-a/batch", encode(forged_on_a_topic))  # the bridge refuses it
            a.publish("gpu-exporter/node-a/batch", encode(own_a))
            b.publish("gpu-exporter/node-b/batch", encode(own_b))

            def value(name: str, **labels: str) -> float:
                return registry.get_sample_value(name, labels) or 0.0

            def written(node: str) -> set[int]:
                return {
                    t for r in rx.requests for labels, points in r.series if ("node", node) in labels for t, _ in points
                }

            wait_until(lambda: written("node-a") and written("node-b"), 20, "both nodes' own batches")
            time.sleep(0.5)  # anything the broker had let through would have arrived by now
        finally:
            for c in clients:
                c.close()
            bridge.stop(5)
            broker.stop()
    assert value("gpu_exporter_bridge_messages_received_total") == 3  # the broker kept node-b's topic
    assert value("gpu_exporter_bridge_payloads_dropped_total", node="node-a", reason="node_mismatch") == 1
    assert written("node-b") == {round(s.timestamp * 1000) for s in own_b.samples}
    assert written("node-a") == {round(s.timestamp * 1000) for s in own_a.samples}


def test_a_rotated_password_file_is_read_again_when_the_bridge_reconnects(tmp_path: Path) -> None:
    # A Kubernetes Secret rotated in place: the broker now wants the new password, and the bridge's
    # mounted file holds it. The bridge must reconnect with it, without a restart, as the agent does.
    broker = Broker(tmp_path / "mqtt", users={"bridge": "old-pw"})
    broker.start()
    secret = tmp_path / "password"
    secret.write_text("old-pw\n")
    registry = CollectorRegistry()

    def connected() -> float:
        return registry.get_sample_value("gpu_exporter_bridge_mqtt_connected") or 0.0

    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        settings = BridgeSettings(
            mqtt_url=broker.url,
            remote_write_url=rx.url,
            mqtt_username="bridge",
            mqtt_password=b"old-pw",  # what the CLI read at start
            mqtt_password_file=str(secret),
            client_id="rotating-bridge",
        )
        bridge = Bridge(settings, registry)
        bridge.start()
        try:
            assert bridge.wait_connected(10), "bridge did not connect with the first password"
            broker.stop()
            wait_until(lambda: connected() == 0, 20, "the bridge to see the broker gone")
            subprocess.run([MOSQUITTO_PASSWD, "-b", str(broker.dir / "passwd"), "bridge", "new-pw"], check=True)
            secret.write_text("new-pw\n")
            broker.start()
            assert bridge.wait_connected(30), "bridge did not reconnect with the rotated password:\n" + broker.log()
            node = NodeClient(broker.port, "bridge", "new-pw")  # the same user: the broker knows no other
            try:
                batch = make_batch("node-r", "boot-r", [1, 2], time.time() - 10)
                node.publish("gpu-exporter/node-r/batch", encode(batch))
                wait_until(lambda: any(r.series for r in rx.requests), 20, "the batch written")
            finally:
                node.close()
        finally:
            bridge.stop(5)
            broker.stop()
