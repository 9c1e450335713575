"""The young connection's ramp (mqtt/ramp.py) on the real kernel's TCP and a real Mosquitto: it ends
within a few round trips on a fast link, and while it holds a write back the forwarder's link waits
for TCP rather than spinning. Its effect on a thin link is measured by bench/bench_weak_link.py."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from gpu_exporter.forward.mqtt import Link
from gpu_exporter.mqtt.packet import PacketGuard
from gpu_exporter.mqtt.ramp import SegmentRamp, TcpState, tcp_state
from gpu_exporter.mqtt.settings import LinkSettings
from tests.support.mosquitto import Broker, broker_fixture, wait_until  # noqa: F401  (the broker fixture)

pytestmark = pytest.mark.integration


def test_on_loopback_the_ramp_ends_within_a_few_pieces_and_every_byte_arrives() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    got = bytearray()

    def drain() -> None:
        while chunk := peer.recv(65536):
            got.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    try:
        ramp = SegmentRamp(lambda: tcp_state(client))
        guard = PacketGuard(client, 1 << 20, ramp)
        data = bytes(range(256)) * 800  # 200 kB
        sent = 0
        deadline = time.monotonic() + 10
        while sent < len(data) and time.monotonic() < deadline:
            try:
                sent += guard.send(data[sent:])
            except BlockingIOError:
                time.sleep(0.001)  # the piece is not acknowledged yet
        assert sent == len(data)
        assert ramp.done and ramp.pieces <= 16  # 4.3 kB on the wire back at once: 14 pieces
    finally:
        client.close()
        reader.join(10)
        peer.close()
        server.close()
    assert bytes(got) == data


def test_while_the_ramp_holds_a_write_back_the_link_waits_for_tcp_without_spinning(broker: Broker) -> None:
    acked: list[int] = []
    settings = LinkSettings("127.0.0.1", broker.port, None, "5", "ramp-test", "", "", 30, 1.0, 4)
    link = Link(
        settings, "gpu-exporter/ramp/status", lambda mid, ok, why: acked.append(mid), lambda: None, lambda m: None
    )
    try:
        for _ in range(200):
            link.step(0.05)
            if link.up:
                break
        assert link.up and link._guard is not None
        polls = 0
        sock = link._guard._sock

        def held_then_real() -> TcpState | None:
            """TCP's state as the kernel says, but the first piece unacknowledged for its first 25 looks."""
            nonlocal polls
            polls += 1
            st = tcp_state(sock)
            if st is not None and polls <= 25:
                return TcpState(st.rto, st.mss, 1, st.since_ack)
            return st

        link._guard.ramp = SegmentRamp(held_then_real)
        mid = link.publish("gpu-exporter/ramp/batch", b"x" * 2000)
        assert mid is not None
        started = time.process_time()
        for _ in range(20):
            link.step(0.1)
            if mid in acked:
                break
        assert mid in acked  # the whole packet went, piece by piece, once TCP had each acknowledged
        assert polls < 200  # a look every 20 ms while held: paho's own loop would have spun
        assert time.process_time() - started < 1.0
    finally:
        link.close()
