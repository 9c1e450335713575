"""Pacing and the incoming-packet guard, piece by piece (timings passed in by hand; the real-time path
through a shaped kernel link is tests/integration/test_forward_realtime.py, a hostile broker tests/integration/test_forward_peers.py).
"""

from __future__ import annotations

import errno
import socket

import pytest

from gpu_exporter.forward.link_meter import FIRST_WINDOW, MIN_WINDOW, OPEN, PACE, LinkMeter
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.mqtt.packet import PacketGuard
from gpu_exporter.mqtt.settings import LinkSettings


def test_nothing_unacknowledged_passes_what_the_link_carries_in_a_share_of_the_keepalive() -> None:
    meter = LinkMeter(None, keepalive=30)
    now = 0.0
    for mid in range(1, 4):  # three packets back to back on a 150 B/s link
        meter.sent(mid, 1500, now)
    for mid in range(1, 4):
        now += 10.0
        meter.acked(mid, now)
    assert meter.capacity == pytest.approx(150)
    window = meter.window()
    assert window == int(150 * PACE * 30)  # 3150 bytes: 21 s of the link
    assert meter.room(window)  # alone (the forwarder cuts packets to the window)
    meter.sent(4, 2000, now)
    assert not meter.room(window - 1999) and meter.room(window - 2000)


def test_a_burst_after_an_idle_link_does_not_size_the_window() -> None:
    """A token bucket lets the first kilobyte through at once: 1 KiB acknowledged in half a second on a
    100 B/s link must not open the window to what 2 kB/s would allow."""
    meter = LinkMeter(None, keepalive=30)
    meter.sent(1, 1024, 0.0)
    meter.acked(1, 0.5)
    assert meter.capacity > 1000  # what the packet alone says...
    assert meter.window() == 2 * FIRST_WINDOW  # ...is not trusted yet: slow start, one doubling
    meter.sent(2, 2048, 1.0)
    meter.acked(2, 21.5)  # the rest of the truth: 100 B/s
    assert meter.window() == pytest.approx(int(meter.capacity * PACE * 30))
    assert meter.window() < 4000


def test_what_is_in_flight_stays_within_tcps_retransmission_timeout() -> None:
    """Early on a connection TCP's timer rests on round trips of tiny packets (the handshake, a burst):
    data that takes the link longer than that timer is sent twice by TCP, and on a thin link a spurious
    retransmission of a full segment costs ten seconds. The window never holds more than the link carries
    within TCP's timeout, whatever the keepalive allows."""
    meter = LinkMeter(None, keepalive=30)
    meter.sent(1, 3000, 0.0)
    meter.acked(1, 20.0)  # 150 B/s, measured
    assert meter.window() == int(150 * PACE * 30)  # TCP's timer unknown: the keepalive's share
    meter.tcp_rto = 5.0  # a young connection: TCP would resend after 5 s
    assert meter.window() == 750
    meter.tcp_rto = 3.0
    assert meter.window() == MIN_WINDOW  # never below the least window
    meter.tcp_rto = 0.2  # TCP's minimum: loopback, or a proxy in front; TCP does not see the thin link
    assert meter.window() == int(150 * PACE * 30)
    meter.tcp_rto = 60.0  # a seasoned connection: the keepalive's share again
    assert meter.window() == int(150 * PACE * 30)


def test_one_packet_at_a_time_until_the_link_is_measured_or_proved_fast() -> None:
    """A packet that rode a thin link's burst comes back at once; two packets written behind it take
    the link 10-20 s, far past TCP's young timer. So until the link is measured, one packet at a time."""
    meter = LinkMeter(None, keepalive=30)
    meter.sent(1, 800, 0.0)
    meter.acked(1, 0.03)  # the burst: it says nothing of the link's rate
    meter.sent(2, 800, 0.1)
    assert not meter.room(800) and not meter.room(1)  # the window would allow it; the start does not
    meter.acked(2, 4.5)  # 4.4 s for 800 bytes
    assert meter.room(1000)  # alone again
    meter.sent(3, 800, 4.5)
    meter.acked(3, 8.9)  # 8.8 s of busy time: measured
    meter.sent(4, 800, 8.9)
    assert meter.room(800)  # the measured window holds more than one packet
    fast = LinkMeter(None, keepalive=30)
    mid, now = 0, 0.0
    while fast.first_window < OPEN:  # a fast link: each PUBACK back in milliseconds
        mid += 1
        fast.sent(mid, fast.window(), now)
        assert not fast.room(1)
        now += 0.005
        fast.acked(mid, now)
    assert mid <= 5  # a few round trips
    fast.sent(mid + 1, 1000, now)
    assert fast.room(1000)


def test_the_link_reads_tcps_retransmission_timeout_from_its_socket() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        settings = LinkSettings("127.0.0.1", 1, None, "5", "t", "", "", 30, 1.0, 16)
        link = Link(settings, "status", lambda *a: None, lambda: None, lambda m: None)
        assert link.tcp_rto() == 0.0  # not connected
        link._guard = PacketGuard(client, 1024)
        link.state = "up"
        assert 0.2 <= link.tcp_rto() <= 3.0  # Linux: at least 200 ms, 1 s before any round trip
    finally:
        for sock in (client, peer, server):
            sock.close()


def test_a_fast_link_opens_the_window_in_a_few_round_trips() -> None:
    meter = LinkMeter(None, keepalive=30)
    for mid in range(1, 12):
        meter.sent(mid, meter.window(), mid * 0.01)
        meter.acked(mid, mid * 0.01 + 0.002)
    assert meter.window() >= 1 << 20


def test_a_puback_timeout_or_a_connection_lost_with_packets_in_flight_halves_the_window() -> None:
    meter = LinkMeter(None, keepalive=30)
    meter.sent(1, 3000, 0.0)
    meter.acked(1, 20.0)  # 150 B/s
    before = meter.window()
    meter.sent(2, 1000, 20.0)
    meter.lost()
    assert meter.inflight_bytes() == 0 and meter.oldest() is None
    assert meter.window() == pytest.approx(before / 2, abs=1)  # half as bold until measured again
    for _ in range(10):
        meter.timed_out()
    assert meter.window() == MIN_WINDOW
    meter.lost()  # nothing in flight: no halving
    assert meter.window() == MIN_WINDOW


class FakeSocket:
    """Hands out a byte stream in whatever pieces the reader asks for, recording each request."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked: list[int] = []

    def recv(self, bufsize: int, *flags: int) -> bytes:
        self.asked.append(bufsize)
        out, self.data = self.data[:bufsize], self.data[bufsize:]
        return out

    def fileno(self) -> int:
        return 7


def read_all(guard: PacketGuard) -> bytes:
    out = b""
    while True:
        chunk = guard.recv(1 << 28)  # what paho asks: the whole rest of the packet at once
        if not chunk:
            return out
        out += chunk


def test_the_guard_passes_packets_within_the_limit_and_never_asks_for_more_than_a_chunk() -> None:
    puback = b"\x40\x02\x00\x07"
    publish = b"\x30\x82\x80\x01" + b"x" * 16386  # remaining length 16386, within 64 KiB
    sock = FakeSocket(puback + publish + puback)
    guard = PacketGuard(sock, 64 * 1024)
    assert read_all(guard) == puback + publish + puback
    assert max(sock.asked) <= 16 * 1024
    assert guard.violation == 0
    assert guard.fileno() == 7  # everything else is the socket's own


@pytest.mark.parametrize("announced", [64 * 1024 - 3, 256_000_000, 2**28 - 1])  # the first: one byte over
def test_the_guard_refuses_a_packet_over_the_limit_before_reading_its_body(announced: int) -> None:
    length = bytearray()
    n = announced
    while True:
        n, byte = divmod(n, 128)
        length.append(byte | (0x80 if n else 0))
        if not n:
            break
    sock = FakeSocket(b"\x30" + bytes(length) + b"\x00" * 4096)
    guard = PacketGuard(sock, 64 * 1024)
    with pytest.raises(ConnectionAbortedError):
        read_all(guard)
    assert guard.violation == 1 + len(length) + announced
    assert sum(sock.asked) == 1 + len(length)  # the header only: not one byte of the body
    with pytest.raises(OSError):
        guard.recv(1)  # and nothing more after


def test_the_guard_wraps_a_real_socket_for_select_and_send() -> None:
    a, b = socket.socketpair()
    try:
        guard = PacketGuard(a, 1024)
        b.sendall(b"\xd0\x00")  # PINGRESP
        assert guard.recv(1) == b"\xd0" and guard.recv(1) == b"\x00"
        assert guard.send(b"\xc0\x00") == 2 and b.recv(2) == b"\xc0\x00"
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("name", "says"),
    [("Keep alive timeout", "lost: Keep alive timeout"), ("Unspecified error", "closed without a DISCONNECT")],
)
def test_the_agents_own_keepalive_close_is_said_as_such(name: str, says: str) -> None:
    """paho closes the connection itself when a PINGRESP is overdue; that was said as "closed without a
    DISCONNECT (the network, a broker restart, or another client...)", hiding an expired keepalive."""
    from types import SimpleNamespace
    from unittest import mock

    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.reasoncodes import ReasonCode

    settings = LinkSettings("127.0.0.1", 1, None, "5", "t", "", "", 30, 1.0, 16)
    link = Link(settings, "status", lambda *a: None, lambda: None, lambda m: None)
    client = mock.MagicMock()
    link._client, link.state = client, "up"
    flags = SimpleNamespace(is_disconnect_packet_from_server=False)
    link._disconnected(client, None, flags, ReasonCode(PacketTypes.DISCONNECT, name), None)
    assert says in link.error, link.error


def test_a_packet_may_be_larger_than_the_window_within_most_of_the_keepalive() -> None:
    """A summary of 8 GPUs (2.4 kB) on a link measured low early on (100 B/s) is over the window (21 s of
    the link), and cut to it cost a second part's headers, some 500 bytes: 5 s more lag at that rate. It
    goes whole, alone, as long as it takes the link under 0.9 of the keepalive."""
    meter = LinkMeter(None, keepalive=30)
    meter.sent(1, 3000, 0.0)
    meter.acked(1, 30.0)  # 100 B/s
    assert meter.window() == 2100
    assert meter.packet_cap() == 2700 > 2480  # the summary and its framing
    meter.sent(2, 2480, 30.0)
    assert not meter.room(100)  # alone: nothing beside it


def test_while_nothing_answers_attempts_go_within_seconds_and_a_refusing_broker_backs_off_to_the_cap() -> None:
    """After ten minutes of an outage the backoff sat at --mqtt.reconnect-max-delay (30 s): the link came
    back and the agent waited up to half a minute more, while HTTP forwarders retried within seconds. A
    refused TCP connection (or a timed-out one, no route, no name) costs a SYN: the next attempt comes
    within 5 s (forward/mqtt.py's PROBE_EVERY); a broker that answered and refused still backs off to
    the cap."""
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: each connect is refused at once, as by a host without its broker
    now = [0.0]
    settings = LinkSettings("127.0.0.1", port, None, "5", "t", "", "", 30, 30.0, 16)
    link = Link(settings, "status", lambda *a: None, lambda: None, lambda m: None, clock=lambda: now[0])
    waits = []
    for _ in range(20):  # an outage: twenty attempts, each refused
        now[0] = link._next_attempt
        link.step(0.0)
        assert link.state == "down" and "refused the TCP connection" in link.error
        waits.append(link._next_attempt - now[0])
    assert max(waits[10:]) <= 5.0
    refusing = Link(settings, "status", lambda *a: None, lambda: None, lambda m: None, clock=lambda: now[0])
    backoff = []
    for _ in range(20):  # a broker that answers CONNECT with a refusal: it is there, and gently asked again
        refusing._fail("refused", "broker refused the connection: Server busy")
        backoff.append(refusing._next_attempt - now[0])
    assert min(backoff[10:]) >= 15.0  # jittered within the upper half of the 30 s cap


@pytest.mark.parametrize(
    ("error", "probe"),
    [
        (ConnectionRefusedError(111, "Connection refused"), True),
        (TimeoutError("timed out"), True),
        (socket.gaierror(-2, "Name or service not known"), True),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), True),
        (OSError(errno.EHOSTUNREACH, "No route to host"), True),
        (OSError(errno.ECONNRESET, "Connection reset by peer"), False),  # something answered: back off
    ],
    ids=["refused", "timeout", "no-name", "no-network", "no-route", "reset"],
)
def test_each_way_a_tcp_connection_fails_to_come_up_is_retried_within_seconds(error: OSError, probe: bool) -> None:
    """Every failure of the TCP connect itself (as the socket raises it to paho's connect) is probed
    again within 5 s after a long outage; one where the peer answered backs off to the 30 s cap."""
    from unittest import mock

    import paho.mqtt.client as paho

    now = [0.0]
    settings = LinkSettings("127.0.0.1", 1, None, "5", "t", "", "", 30, 30.0, 16)
    link = Link(settings, "status", lambda *a: None, lambda: None, lambda m: None, clock=lambda: now[0])
    waits = []
    with mock.patch.object(paho.Client, "connect", side_effect=error):
        for _ in range(20):
            now[0] = link._next_attempt
            link.step(0.0)
            assert link.state == "down"
            waits.append(link._next_attempt - now[0])
    if probe:
        assert max(waits[10:]) <= 5.0, (link.error, waits)
    else:
        assert min(waits[10:]) >= 15.0, (link.error, waits)
