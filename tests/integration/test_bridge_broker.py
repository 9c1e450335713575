"""deploy/cloud-broker as shipped, run by a real Mosquitto: no client is anonymous, a node writes only
under its own name, the bridge reads (and only reads) on the in-cluster listener, and a packet over the
broker's max_packet_size never reaches the bridge."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gpu_exporter.payload import encode
from tests.support.bridge_helpers import BridgeProcess, ScriptedReceiver, make_batch
from tests.support.deployed import CloudBroker, Manifest, NodePaths, provision_node_credentials
from tests.support.mosquitto import make_tls, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PACKET_LIMIT = 4259840  # max_packet_size in deploy/cloud-broker/mosquitto.conf


class Client:
    """One MQTT 5 connection; records its CONNACK, PUBACK reason codes and disconnection."""

    def __init__(self, port: int, client_id: str, **auth: str) -> None:
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=MQTTProtocolVersion.MQTTv5)
        self.connack: int | None = None
        self.acks: dict[int, int] = {}
        self.disconnected = threading.Event()
        if auth.get("username"):
            self.client.username_pw_set(auth["username"], auth.get("password"))
        if auth.get("ca"):
            self.client.tls_set(ca_certs=auth["ca"], certfile=auth.get("cert"), keyfile=auth.get("key"))
        self.client.on_connect = lambda c, u, f, rc, p: setattr(self, "connack", rc.value)
        self.client.on_publish = lambda c, u, mid, rc, p: self.acks.__setitem__(mid, rc.value)
        self.client.on_disconnect = lambda *a: self.disconnected.set()
        self.client.connect("127.0.0.1", port, keepalive=10)
        self.client.loop_start()
        assert wait_until(lambda: self.connack is not None or self.disconnected.is_set(), 10)

    def publish(self, topic: str, payload: bytes) -> int:
        return int(self.client.publish(topic, payload, qos=1).mid)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[tuple[CloudBroker, dict[str, str], dict[str, str]]]:
    tls = make_tls(tmp_path / "pki", client=False)
    manifest = Manifest.load()
    node_files = {}
    for node in ("edge-7", "edge-8"):
        paths = NodePaths(manifest, tmp_path / node)
        provision_node_credentials(paths, manifest, tls, node)
        mqtt_dir = paths.host("/etc/gpu-exporter/mqtt")
        node_files[node] = str(mqtt_dir)
    broker = CloudBroker(tmp_path / "cloud", tls)
    broker.start()
    yield broker, tls, node_files
    broker.stop()


def _node(broker: CloudBroker, tls: dict[str, str], node_dir: str, node: str) -> Client:
    return Client(broker.port, node, ca=tls["ca"], cert=f"{node_dir}/tls.crt", key=f"{node_dir}/tls.key")


def test_no_anonymous_client_and_the_bridge_only_reads(
    cloud: tuple[CloudBroker, dict[str, str], dict[str, str]],
) -> None:
    broker, tls, _ = cloud
    anonymous = Client(broker.internal_port, "anyone-in-the-cluster")
    wrong = Client(broker.internal_port, "guesser", username=broker.BRIDGE_USER, password="guess")
    bridge = Client(broker.internal_port, "bridge", username=broker.BRIDGE_USER, password=broker.bridge_password)
    try:
        assert anonymous.connack == 135  # not authorized
        assert wrong.connack == 135  # Mosquitto 2.0 answers a wrong password "not authorized" too
        assert bridge.connack == 0
        mid = bridge.publish("gpu-exporter/edge-7/batch", b"forged by the bridge's user")
        assert wait_until(lambda: mid in bridge.acks, 10)
        assert bridge.acks[mid] == 0x87  # not authorized: the bridge's user reads only
    finally:
        for c in (anonymous, wrong, bridge):
            c.close()
    try:  # the edge listener: no certificate, no session (refused in the handshake or right after)
        edge = Client(broker.port, "no-certificate", ca=tls["ca"])
        accepted = edge.connack == 0
        edge.close()
    except (ssl.SSLError, OSError):
        accepted = False
    assert not accepted


def test_a_node_writes_under_its_own_name_only_and_large_packets_never_reach_the_bridge(
    cloud: tuple[CloudBroker, dict[str, str], dict[str, str]], tmp_path: Path
) -> None:
    broker, tls, nodes = cloud
    now = time.time()
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        bridge = BridgeProcess(tmp_path, broker, rx.url, "cloud-bridge", "--bridge.group=g", *broker.credentials)
        bridge.start()  # connected and subscribed (a shared subscription) with its password
        edge7 = _node(broker, tls, nodes["edge-7"], "edge-7")
        flooder = _node(broker, tls, nodes["edge-8"], "edge-8")
        try:
            forged = edge7.publish("gpu-exporter/edge-8/batch", encode(make_batch("edge-8", "x", [1], now - 30)))
            own = edge7.publish("gpu-exporter/edge-7/batch", encode(make_batch("edge-7", "b", [1, 2], now - 20)))
            assert wait_until(lambda: forged in edge7.acks and own in edge7.acks, 10)
            assert edge7.acks[forged] == 0x87 and edge7.acks[own] == 0
            flooder.publish("gpu-exporter/edge-8/batch", b"x" * PACKET_LIMIT)  # over the limit with its header
            assert flooder.disconnected.wait(10), "the broker kept a client that sent a packet over max_packet_size"
            assert wait_until(lambda: bridge.metric("gpu_exporter_bridge_gpu_samples_written_total") == 4, 20)
            time.sleep(1.0)
            assert bridge.metric("gpu_exporter_bridge_messages_received_total") == 1
            written = {v for r in rx.requests for labels, _ in r.series for k, v in labels if k == "node"}
            assert written == {"edge-7"}
        finally:
            edge7.close()
            flooder.close()
            bridge.stop()
