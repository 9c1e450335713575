"""The fleet bench's simulated node puts on the wire exactly what the agent does.

bench/bench_fleet.py drives 5,000 connections with a hand-written MQTT 5 publisher and patched payload
templates (bench/fleet_wire.py, fleet_payloads.py, fleet_nodes.py), because 5,000 paho clients and
encoders do not fit in one process. Its figures mean something only while that load is the agent's: so
one simulated node and the agent's own client (forward/mqtt.Link, paho) connect to the same recording
peer, and their CONNECT, status PUBLISH and batch PUBLISH must be byte for byte the same; the batch's
payload must be the agent's own ``encode`` of the samples the template stands for.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.forward.service import WINDOW
from gpu_exporter.mqtt import sendtime
from gpu_exporter.mqtt.settings import LinkSettings
from gpu_exporter.payload import Batch, encode
from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))

from fleet_nodes import Fleet, FleetSettings
from fleet_payloads import Templates

SENT_MS = 1_796_000_000_123
NODE = 3


class RecordingBroker:
    """Accepts one connection, records every packet whole, answers CONNACK and PUBACK as a broker would."""

    def __init__(self, packets: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.packets: list[bytes] = []
        self._want = packets
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(20)
        conn, _ = self.sock.accept()
        conn.settimeout(20)
        with conn:
            buf = b""
            while len(self.packets) < self._want:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
                while True:
                    packet, buf = _split(buf)
                    if packet is None:
                        break
                    self.packets.append(packet)
                    kind = packet[0] & 0xF0
                    if kind == 0x10:
                        conn.sendall(bytes((0x20, 3, 0, 0, 0)))  # CONNACK: success, no properties
                    elif kind == 0x30 and packet[0] & 0x06:
                        topic_len = int.from_bytes(packet[_body_at(packet) : _body_at(packet) + 2], "big")
                        mid_at = _body_at(packet) + 2 + topic_len
                        conn.sendall(bytes((0x40, 2)) + packet[mid_at : mid_at + 2])
            time.sleep(0.2)

    def join(self) -> list[bytes]:
        self._thread.join(20)
        self.sock.close()
        return self.packets


def _body_at(packet: bytes) -> int:
    i = 1
    while packet[i] & 0x80:
        i += 1
    return i + 1


def _split(buf: bytes) -> tuple[bytes | None, bytes]:
    if len(buf) < 2:
        return None, buf
    length, shift, i = 0, 0, 1
    while True:
        if i >= len(buf):
            return None, buf
        length |= (buf[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not buf[i - 1] & 0x80:
            break
    if len(buf) < i + length:
        return None, buf
    return buf[: i + length], buf[i + length :]


def agent_packets(payload: bytes, node: str, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """CONNECT, status and one batch PUBLISH from the agent's own Link, as the forwarder sets it up."""
    broker = RecordingBroker(3)
    config = cfg.replace(cfg.Config(), node_name=node, mqtt_url=f"mqtt://127.0.0.1:{broker.port}")
    monkeypatch.setattr(sendtime, "time", SimpleNamespace(time_ns=lambda: SENT_MS * 1_000_000))
    acks: list[int] = []
    link = Link(
        LinkSettings.from_config(config, window=WINDOW),
        f"{config.mqtt_topic_prefix}/{node}/status",
        lambda mid, ok, reason: acks.append(mid),
        lambda: None,
        lambda message: None,
    )
    deadline = time.monotonic() + 20
    while not link.up and time.monotonic() < deadline:
        link.step(0.05)
    assert link.up, link.error
    assert link.publish(f"{config.mqtt_topic_prefix}/{node}/batch", payload) is not None
    while not acks and time.monotonic() < deadline:
        link.step(0.05)
    link.close(flush=0.1)
    return broker.join()


def sim_packets(templates: Templates) -> tuple[list[bytes], bytes, str, int]:
    """The same from one simulated node of the fleet bench: (packets, payload, boot, newest sample ms)."""
    broker = RecordingBroker(3)
    last_ms = SENT_MS - 2_000

    async def run() -> tuple[bytes, str]:
        fleet = Fleet(
            FleetSettings("127.0.0.1", broker.port, nodes=1, interval=120, first=NODE),
            templates,
            clock=lambda: SENT_MS / 1000,
        )
        node = fleet.nodes[0]
        msg = node.close_batch(last_ms, templates)
        node.live.append(msg)
        fleet.start()
        deadline = time.monotonic() + 20
        while not node.acked and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await fleet.close()
        return msg.payload, node.boot

    payload, boot = asyncio.run(run())
    return broker.join(), payload, boot, last_ms


def test_simulated_node_publishes_what_the_agent_publishes(monkeypatch: pytest.MonkeyPatch) -> None:
    templates = Templates(gpus=8, per_batch=24, spacing=5.0, count=2)
    sim, payload, boot, last_ms = sim_packets(templates)
    node = f"edge-{NODE:05d}"

    # the payload is the agent's own encoding of the samples the simulated batch stands for
    samples = templates.samples(NODE, 1, last_ms)
    assert len(samples) == 24 and all(len(s.devices) == 8 for s in samples)
    assert len({d.device.uuid for d in samples[0].devices}) == 8
    agent_payload = encode(Batch(node, boot, tuple(samples)))
    assert payload == agent_payload

    agent = agent_packets(agent_payload, node, monkeypatch)
    assert [p[0] for p in sim] == [0x10, 0x33, 0x32]  # CONNECT, retained status, QoS 1 batch
    assert sim[0] == agent[0], "CONNECT differs"
    assert sim[1] == agent[1], "status PUBLISH differs"
    assert sim[2] == agent[2], "batch PUBLISH differs"


def test_templates_vary_values_and_identity_per_node() -> None:
    """Neighbouring nodes and successive batches of one node do not send the same values."""
    templates = Templates(gpus=2, per_batch=4, spacing=5.0, count=3)
    a = templates.samples(0, 1, 10_000_000)
    b = templates.samples(1, 1, 10_000_000)
    a2 = templates.samples(0, 5, 10_020_000)
    assert a[0].devices[0].device.uuid != b[0].devices[0].device.uuid
    assert dict(a[0].devices[0].values) != dict(b[0].devices[0].values)
    assert dict(a[0].devices[0].values) != dict(a2[0].devices[0].values)
    assert [s.timestamp for s in a2][-1] == 10_020.0
