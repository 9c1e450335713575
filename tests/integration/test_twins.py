"""Twin agents (one node name, two boots live) named in the agent's log and counted: on real Mosquitto
(which closes the older connection without a reason, on MQTT 5 and 3.1.1), and against a broker that
says Session taken over (MQTT 5 reason 0x8E); a broker restarting is not taken for a twin."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.forward.twins import WINDOW, TwinWatch
from tests.support import free_port
from tests.support.agent_proc import Proc
from tests.support.mosquitto import Broker, broker_fixture, wait_until  # noqa: F401  (the broker fixture)

TAKEOVERS = "gpu_exporter_forward_session_takeovers_total"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _count(registry: CollectorRegistry, evidence: str) -> float:
    return registry.get_sample_value(TAKEOVERS, {"evidence": evidence}) or 0.0


def test_the_watch_counts_a_reason_at_once_and_a_pattern_from_the_third_early_loss() -> None:
    registry, clock = CollectorRegistry(), Clock()
    watch = TwinWatch(registry, "edge-1", "gpu-exporter-edge-1", clock=clock)
    watch.down((0x8E, True, 40.0))
    assert _count(registry, "reason") == 1
    for _ in range(2):
        clock.now += 5
        watch.down((0x80, False, 3.0))  # closed by the broker 3 s after connecting, no reason
    assert _count(registry, "pattern") == 0
    clock.now += 5
    watch.down((0x80, False, 3.0))
    assert _count(registry, "pattern") == 1
    clock.now += 5
    watch.down((0x80, False, 3.0))  # the pattern goes on: each loss counts
    assert _count(registry, "pattern") == 2
    assert registry.get_sample_value("gpu_exporter_forward_twin_suspected") == 1
    clock.now += 301
    assert registry.get_sample_value("gpu_exporter_forward_twin_suspected") == 0


@pytest.mark.parametrize(
    "between",
    [
        None,  # a failed connection attempt: the broker was not there, not a twin
        (0x8D, False, 3.0),  # keepalive timeout: a network, not a twin
        (0x80, False, 200.0),  # a connection that lasted: not a twin's
        (0x87, True, 3.0),  # the broker said why (Not authorized): not a twin
    ],
)
def test_a_failed_attempt_a_timeout_or_a_long_connection_breaks_the_pattern(between: object) -> None:
    registry, clock = CollectorRegistry(), Clock()
    watch = TwinWatch(registry, "edge-1", "gpu-exporter-edge-1", clock=clock)
    for loss in [(0x80, False, 3.0), (0x80, False, 3.0), between, (0x80, False, 3.0), (0x80, False, 3.0)]:
        clock.now += 5
        watch.down(loss)  # type: ignore[arg-type]
    assert _count(registry, "pattern") == 0 and _count(registry, "reason") == 0


def test_early_losses_spread_over_more_than_the_window_are_no_twin() -> None:
    """A broker restart now and then, each closing a fresh connection, is not a second agent; the same
    losses close together are."""
    registry, clock = CollectorRegistry(), Clock()
    watch = TwinWatch(registry, "edge-1", "gpu-exporter-edge-1", clock=clock)
    for _ in range(3):
        clock.now += WINDOW + 1
        watch.down((0x80, False, 3.0))
    assert _count(registry, "pattern") == 0
    assert registry.get_sample_value("gpu_exporter_forward_twin_suspected") == 0
    for _ in range(2):
        clock.now += 5
        watch.down((0x80, False, 3.0))
    assert _count(registry, "pattern") == 1  # the last three came within the window


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_two_agents_with_one_node_name_on_mosquitto_are_named_and_counted(
    tmp_path: Path, broker: Broker, protocol: str
) -> None:
    args = [
        "--gpu-vendor=fake",
        "--fake.gpus=1",
        "--gpu-metrics-collection-interval=200ms",
        "--node-name=edge-7",
        f"--mqtt.url={broker.url}",
        f"--mqtt.protocol={protocol}",
        "--mqtt.reconnect-max-delay=2s",
    ]
    first = Proc(tmp_path, *args, f"--spool.dir={tmp_path / 'spool-a'}", name="a").start()
    second = Proc(tmp_path, *args, f"--spool.dir={tmp_path / 'spool-b'}", name="b").start()
    try:
        key = TAKEOVERS + '{evidence="pattern"}'
        assert wait_until(lambda: first.metric(key) >= 1 and second.metric(key) >= 1, 60), (
            first.log()[-2000:],
            second.log()[-2000:],
        )
        assert first.metric("gpu_exporter_forward_twin_suspected") == 1
        for proc in (first, second):
            line = [x for x in proc.log().splitlines() if "another MQTT client is using" in x]
            assert len(line) == 1 and "'gpu-exporter-edge-7'" in line[0] and "--node-name=edge-7" in line[0]
    finally:
        assert first.stop() == 0 and second.stop() == 0


def test_a_broker_restarting_is_not_taken_for_a_twin(tmp_path: Path, broker: Broker) -> None:
    """Mosquitto closes every connection when it stops, as it closes a twin's: what differs is that the
    agent's retry fails while the broker is down. (One that restarts faster than the agent retries, under
    half a second, three times in five minutes, would look like a twin: the log says "likely".)"""
    proc = Proc(
        tmp_path,
        "--gpu-vendor=fake",
        "--fake.gpus=1",
        "--gpu-metrics-collection-interval=200ms",  # the self-metrics are rendered with each sample
        "--node-name=edge-8",
        f"--mqtt.url={broker.url}",
        "--mqtt.reconnect-max-delay=1s",
        f"--spool.dir={tmp_path / 'spool'}",
    ).start()
    connected = "gpu_exporter_forward_connected"
    refused = 'gpu_exporter_forward_connect_errors_total{kind="unreachable"}'
    try:
        for _ in range(3):
            assert wait_until(lambda: proc.metric(connected) == 1, 30), proc.log()[-2000:]
            before = proc.metric(refused)
            broker.stop()
            # down for as long as a restart takes: the agent's first retry (after 0.25-0.5 s) finds it gone
            assert wait_until(lambda before=before: proc.metric(refused) > before, 30)
            broker.start()
        assert wait_until(lambda: proc.metric(connected) == 1, 30)
        assert proc.metric(TAKEOVERS + '{evidence="pattern"}') == 0
        assert "another MQTT client" not in proc.log()
    finally:
        assert proc.stop() == 0


class TakeoverBroker:
    """An MQTT 5 broker that accepts every connection, then ends it with DISCONNECT 0x8E (Session taken
    over) as HiveMQ or EMQX do when another client connects with the same client id."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    _read_packet(conn)  # CONNECT
                    conn.sendall(b"\x20\x03\x00\x00\x00")  # CONNACK: no session, success, no properties
                    self.connections += 1
                    self._stop.wait(0.5)
                    conn.sendall(b"\xe0\x02\x8e\x00")  # DISCONNECT, Session taken over
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()


def _read_packet(conn: socket.socket) -> bytes:
    head = conn.recv(1)
    length, shift = 0, 0
    while True:
        byte = conn.recv(1)[0]
        length |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            break
    body = b""
    while len(body) < length:
        chunk = conn.recv(length - len(body))
        if not chunk:
            raise OSError("closed")
        body += chunk
    return head + body


@pytest.fixture
def takeover() -> Iterator[TakeoverBroker]:
    broker = TakeoverBroker()
    yield broker
    broker.stop()


def test_a_broker_that_says_session_taken_over_is_believed_at_once(tmp_path: Path, takeover: TakeoverBroker) -> None:
    proc = Proc(
        tmp_path,
        "--gpu-vendor=fake",
        "--fake.gpus=1",
        "--gpu-metrics-collection-interval=200ms",
        "--node-name=edge-9",
        f"--mqtt.url=mqtt://127.0.0.1:{takeover.port}",
        "--mqtt.reconnect-max-delay=1s",
        f"--spool.dir={tmp_path / 'spool'}",
    ).start()
    try:
        assert wait_until(lambda: proc.metric(TAKEOVERS + '{evidence="reason"}') >= 2, 30), proc.log()[-2000:]
        lines = [x for x in proc.log().splitlines() if "another MQTT client is using" in x]
        assert len(lines) == 1 and "Session taken over" in lines[0], lines  # said once, not per connection
        assert "Traceback" not in proc.log()
    finally:
        assert proc.stop() == 0
