"""A young TCP connection's first segments, sized to its retransmission timer (mqtt/ramp.py), through
the socket wrapper paho writes to (PacketGuard). TCP's state is scripted here; the real kernel's is in
tests/integration/test_forward_ramp.py, the real-time effect on a shaped link in bench/bench_weak_link.py.
"""

from __future__ import annotations

import socket

import pytest

from gpu_exporter.mqtt.packet import PacketGuard
from gpu_exporter.mqtt.ramp import FIRST, HEADERS, MIN_PIECE, QUICK_BYTES, QUICK_PIECE, SHARE, SegmentRamp, TcpState


class ScriptedTcp:
    """A socket whose TCP state the test sets: what TCP_INFO would say, and what the kernel was handed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.rto = 0.2  # Linux's floor: what a connection whose round trips rode a burst has
        self.mss = 1448
        self.unacked = 0
        self.acked_at = 0.0
        self.written: list[int] = []
        self.options: list[tuple[int, int, int]] = []

    def state(self) -> TcpState:
        return TcpState(self.rto, self.mss, self.unacked, self.now - self.acked_at)

    def send(self, data: bytes | memoryview, *flags: int) -> int:
        self.written.append(len(data))
        self.unacked = 1
        return len(data)

    def ack(self, after: float) -> None:
        """TCP has the piece on the link acknowledged ``after`` seconds from now."""
        self.now += after
        self.acked_at = self.now
        self.unacked = 0

    def recv(self, bufsize: int, *flags: int) -> bytes:
        return b"\x40"  # the first byte of a PUBACK

    def setsockopt(self, level: int, option: int, value: int) -> None:
        self.options.append((level, option, value))


def guarded(tcp: ScriptedTcp) -> PacketGuard:
    return PacketGuard(tcp, 1 << 20, SegmentRamp(tcp.state, clock=lambda: tcp.now))


def test_a_young_connection_hands_the_kernel_one_piece_at_a_time_within_tcps_timer() -> None:
    """On a thin link whose first round trips rode a burst, TCP's timer is 0.2 s while a full segment takes
    seconds: a packet handed whole is sent twice by TCP. Pieces go one at a time, each only once TCP has
    the previous acknowledged; a piece that rode the burst measures nothing; on a slow link each piece
    takes at most SHARE of the timer at the rate the previous one measured, and once the timer covers a
    full segment, what it does not cover waits for the acknowledgement of what went before."""
    tcp = ScriptedTcp()
    guard = guarded(tcp)
    packet = b"x" * 3000
    assert guard.send(packet) == FIRST  # not 3000: the whole packet at once is what TCP resends
    with pytest.raises(BlockingIOError):
        guard.send(packet[FIRST:])  # paho keeps the rest for later
    assert guard.holding()
    tcp.ack(after=0.001)  # rode the token bucket's burst: says nothing of the link
    assert not guard.holding()
    assert guard.send(packet[FIRST:]) == 2 * FIRST
    tcp.ack(after=(2 * FIRST + HEADERS) / 150)  # the link's own rate: 150 B/s
    assert guard.send(packet) == MIN_PIECE  # 0.2 s of 150 B/s is less than a segment's headers
    tcp.rto = 1.2  # the slow round trip grew TCP's timer
    tcp.ack(after=(MIN_PIECE + HEADERS) / 150)
    assert guard.send(packet) == int(SHARE * 1.2 * 150) - HEADERS  # 78: 0.96 s of the link
    tcp.rto = 15.0
    tcp.ack(after=(78 + HEADERS) / 150)
    assert guard.send(packet) == 1448  # the timer covers a full segment (1.7 kB): whole segments from now on
    tcp.ack(after=(1448 + HEADERS) / 150)
    assert guard.send(packet) == 1448  # not 3000: the second segment would wait beyond the timer
    with pytest.raises(BlockingIOError):
        guard.send(packet)  # ... so it goes once the first is acknowledged
    tcp.rto = 40.0
    tcp.ack(after=(1448 + HEADERS) / 150)
    assert guard.send(packet) == 3000  # a timer that covers both: the packet whole
    assert tcp.written == [FIRST, 2 * FIRST, MIN_PIECE, 78, 1448, 1448, 3000]


def test_a_fast_link_leaves_the_ramp_once_more_came_back_quickly_than_a_burst_lends() -> None:
    tcp = ScriptedTcp()
    guard = guarded(tcp)
    while guard.send(b"x" * 100_000) < 100_000:
        tcp.ack(after=0.002)  # every piece back at once: loopback, a LAN, a fast WAN
    quick = -(-(QUICK_BYTES - FIRST - HEADERS) // (QUICK_PIECE + HEADERS))  # 13 pieces of 256 after the first
    assert tcp.written == [FIRST] + [QUICK_PIECE] * quick + [100_000]  # then whole: ramp over
    assert FIRST + HEADERS + quick * (QUICK_PIECE + HEADERS) >= QUICK_BYTES > 1600


def test_a_token_bucket_that_lends_six_quick_pieces_does_not_end_the_ramp() -> None:
    """A 150 B/s link behind a bucket of 1,600 bytes, and the packets of a CI run's first seconds: a
    45-byte packet, then two raw batches of 810 and 809 bytes. Their first six pieces (45, 256, 256, 256,
    41, 256: 1.5 kB on the wire) came back at once; taken for a fast link, the ramp ended there, and the
    next 2.5 kB summary went to the kernel whole: TCP, its timer still near 0.2 s, resent it again and
    again, no PUBACK came within a minute, and the agent reconnected. The ramp lasts; the first piece
    the bucket no longer covers is slow, and the connection stays in pieces TCP's timer covers."""
    tcp = ScriptedTcp()
    guard = guarded(tcp)
    lent = 1600  # bytes the bucket lets through at once
    sizes: list[int] = []
    for packet in (b"x" * 45, b"x" * 810, b"x" * 809):
        rest = len(packet)
        while rest:
            sent = guard.send(packet[len(packet) - rest :])
            sizes.append(sent)
            rest -= sent
            lent -= sent + HEADERS
            tcp.ack(after=0.002 if lent >= 0 else (sent + HEADERS) / 150)
    assert sizes[:6] == [45, 256, 256, 256, 42, 256]  # six quick pieces: what ended the ramp before
    assert guard.ramp is not None and not guard.ramp.done and not guard.ramp.quick()  # a slow one since: thin
    tcp.rto = 3.0  # the slow round trips grew TCP's timer
    assert guard.send(b"x" * 2500) < 2500  # the summary in pieces within 0.8 of the timer, not whole


def test_without_tcp_state_nothing_is_held_back() -> None:
    """Where TCP_INFO says nothing (another platform, a socket that is no TCP socket), writes pass whole."""
    ramp = SegmentRamp(lambda: None)
    sock = ScriptedTcp()
    guard = PacketGuard(sock, 1 << 20, ramp)
    assert guard.send(b"x" * 5000) == 5000
    assert not guard.holding()


def test_what_comes_in_on_a_young_connection_is_acknowledged_at_once() -> None:
    """A PUBACK whose acknowledgement waits behind a piece for seconds is sent again by the broker's own
    young timer, and each copy costs the uplink a duplicate acknowledgement: TCP is told to acknowledge
    what came in at once (TCP_QUICKACK), while the ramp lasts."""
    tcp = ScriptedTcp()
    guard = guarded(tcp)
    guard.recv(1)
    assert (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1) in tcp.options
    tcp.options.clear()
    assert PacketGuard(tcp, 1 << 20).recv(1) and tcp.options == []  # no ramp, no option


def test_a_packet_whose_pieces_all_came_back_quickly_measures_nothing() -> None:
    """The first packets ride the link's burst; split into pieces, each ending inside the packet, they take
    the broker's delayed acknowledgements (40 ms each), and their PUBACK would read a link of kB/s where
    it carries 150 B/s (raw batches then went ahead of the first summary: 59 s in minute 2). Until a
    round trip is slow the ramp says so (``quick``), and the forwarder takes no capacity figure."""
    tcp = ScriptedTcp()
    guard = guarded(tcp)
    assert guard.ramp is not None and not guard.ramp.quick()  # nothing sent yet
    guard.send(b"x" * 1000)
    tcp.ack(after=0.045)  # the peer's delayed acknowledgement
    assert guard.ramp.quick()
    guard.send(b"x" * 872)
    tcp.ack(after=(256 + HEADERS) / 150)  # slow: the burst is spent, this is the link
    assert not guard.ramp.quick()


def test_a_tiny_packet_between_flights_measures_nothing() -> None:
    """A PINGREQ (2 bytes) comes back in half a second on a 150 B/s link: taken as the link's rate, its
    headers and the broker's quick answer made the next flight a full segment where TCP's timer did not
    cover one, and TCP resent it (1448 bytes in minute 3 of one run)."""
    tcp = ScriptedTcp()
    guard = guarded(tcp)
    guard.send(b"x" * 3000)
    tcp.ack(after=(FIRST + HEADERS) / 150)  # slow for a timer of 0.2 s: a 150 B/s link
    assert guard.send(b"x" * 3000) == MIN_PIECE
    tcp.rto = 12.0  # what TCP's timer is after such round trips: 0.8 of it covers 1440 bytes at 150 B/s
    tcp.ack(after=(MIN_PIECE + HEADERS) / 150)
    for piece in (128, 256, 512, 1024):
        assert guard.send(b"x" * 3000) == piece
        tcp.ack(after=(piece + HEADERS) / 150)
    assert guard.send(b"\xc0\x00") == 2  # a PINGREQ
    tcp.ack(after=0.4)  # 68 bytes in 0.4 s would read 170 B/s: a full segment within 0.8 of the timer
    assert guard.send(b"x" * 3000) == int(SHARE * 12.0 * 150) - HEADERS  # 1374: it is not
