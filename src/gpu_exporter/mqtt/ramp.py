"""A young TCP connection's first segments, sized to its retransmission timer (docs/forwarding.md,
"Pacing").

TCP's retransmission timer (RTO) rests on the round trips it has measured. On a thin link whose first
packets ride a burst (a token bucket's, a radio scheduler's) those are a few milliseconds, so the timer
starts at its 200 ms floor, while one full segment takes the link seconds (10 s at 150 B/s). The first
segment that has to wait for the link is then sent twice: the timer fires while it waits in the host's
queue, and Linux resends it the moment the original leaves, a full segment's worth of the link wasted.
The broker's own timer is as young: its PUBACK, whose acknowledgement waits behind that segment, comes
again and again, and each copy costs the uplink a duplicate acknowledgement. Nothing lets an
unprivileged program raise the timer (the socket option ``TCP_RTO_MIN_US`` only lowers it); only round
trips that the link made slow grow it.

So the agent hands the kernel one piece at a time, the next only
once TCP has had the previous acknowledged, each as large as the link carries in ``SHARE`` of the timer
(at the rate the previous piece measured, its headers counted) and at most twice the previous one. A
piece that rode a burst measures no rate: until a round trip was slow, pieces are at most
``QUICK_PIECE`` (doubling from ``FIRST`` would make the piece that finds the burst spent a large one:
844 bytes, 6 s of a 150 B/s link, in one run), and a fast link leaves the ramp once its pieces came back
quickly with more bytes on the wire, headers counted, than a burst lends (``QUICK_BYTES``). A count of quick
pieces is no such proof: six pieces of up to 256 bytes take 1.5 kB on the wire, which a token bucket of
1,600 bytes lends at once, and a connection that left the ramp on them then wrote 2.5 kB summaries whole
into a 150 B/s link (TCP resent them, a PUBACK did not come within a minute, the agent reconnected).
On a thin link the first piece that meets an empty bucket is
still resent by TCP, but it is a small one, and its slow round trip grows the timer: each later piece
stays within it and grows it further (about 1.6 times a round trip, from what Linux's estimator does
with such samples), until a full segment fits. From then on, for as long as the connection lasts, a
write larger than the timer covers goes in flights of whole segments, the next once TCP has had the
previous acknowledged: the timer, now grown from the link's own round trips, stays near them (12-17 s at
150 B/s), and the second segment of a 2.5 kB summary handed at once waited 17-18 s in the host's queue
and was resent. The cost is a segment header per piece (66 bytes) for the
first round trips of a connection. Until a round trip was slow, a packet's rest of up to twice the
piece goes whole, and a PUBACK then measures nothing of the link (``quick``: its time was a burst's, or
the peer's delayed acknowledgements of pieces). Meanwhile what the broker sends is acknowledged at once (``quick_ack``)
rather than with the next piece: a PUBACK whose acknowledgement waits two seconds behind a piece comes
again four times (the broker's timer is as young), and each copy costs the uplink a duplicate
acknowledgement.
"""

from __future__ import annotations

import logging
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FIRST",
    "FULL",
    "HEADERS",
    "MIN_PIECE",
    "QUICK_BYTES",
    "SHARE",
    "SegmentRamp",
    "TcpState",
    "quick_ack",
    "tcp_state",
]

HEADERS = 66  # bytes a segment takes on the wire beside its payload (Ethernet, IPv4, TCP with timestamps)
FIRST = 128  # bytes of the first piece, before anything is measured
QUICK_PIECE = 256  # the largest piece until a round trip was slow (what TCP resends when a burst runs out)
MIN_PIECE = 32  # the least piece handed over (below that, headers are most of the link's time)
SHARE = 0.8  # a piece takes the link at most this share of TCP's timer
FULL = 1448  # bytes of a full segment on an Ethernet path (loopback's segments are far larger)
QUICK_BYTES = 3 * FULL  # pieces all back quickly, this many bytes of them on the wire: more than a burst lends

# struct tcp_info (linux/tcp.h): eight one-byte fields, then u32s: rto, ato, snd_mss, rcv_mss, unacked,
# sacked, lost, retrans, fackets, last_data_sent, last_ack_sent, last_data_recv, last_ack_recv (ms); at
# byte 144 (Linux 4.6 and later) notsent_bytes
_INFO = struct.Struct("=8xIIIIIIIIIIIII")
_NOTSENT = struct.Struct("=144xI")
log = logging.getLogger("gpu_exporter.forward")

_TCP_INFO = getattr(socket, "TCP_INFO", 0)
_TCP_QUICKACK = getattr(socket, "TCP_QUICKACK", 0)


@dataclass(frozen=True)
class TcpState:
    """What ``TCP_INFO`` says of a connection now."""

    rto: float  # the retransmission timeout, seconds
    mss: int  # the largest segment's payload, bytes
    unacked: int  # segments sent and not acknowledged
    since_ack: float  # seconds since the last acknowledgement came in
    notsent: int = 0  # bytes written to the socket that TCP has not sent yet


def tcp_state(sock: Any) -> TcpState | None:
    """``sock``'s TCP state (Linux), or None where the platform or the socket does not say."""
    if not _TCP_INFO:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, _NOTSENT.size)
    except (OSError, ValueError, AttributeError):
        return None
    if len(info) < _INFO.size:
        return None
    rto, _ato, mss, _rmss, unacked, *_rest, last_ack_recv = _INFO.unpack_from(info)
    notsent = _NOTSENT.unpack_from(info)[0] if len(info) >= _NOTSENT.size else 0
    return TcpState(rto / 1e6, mss, unacked, last_ack_recv / 1000, notsent)


def quick_ack(sock: Any) -> None:
    """Have TCP acknowledge what came in now, as an acknowledgement of its own (Linux ``TCP_QUICKACK``),
    rather than with the next piece, which may wait seconds for the link: meanwhile the broker's timer,
    as young as the agent's, would send its packet again, and each copy costs the uplink a duplicate
    acknowledgement."""
    if _TCP_QUICKACK:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, _TCP_QUICKACK, 1)
        except (OSError, ValueError, AttributeError):
            pass


class SegmentRamp:
    """How many bytes the kernel may be handed now, while the connection is young (the module doc)."""

    def __init__(self, state: Callable[[], TcpState | None], clock: Callable[[], float] = time.monotonic) -> None:
        self._state = state
        self._clock = clock
        self.done = False  # a fast link (or TCP says nothing): no limit from now on
        self.pieces = 0  # pieces handed over so far
        self._piece = 0  # bytes of the piece TCP has not had acknowledged yet (0: none)
        self._sent_at = 0.0
        self._last = 0  # bytes of the last piece acknowledged
        self._rate = 0.0  # wire bytes per second the last piece took the link (0: none yet)
        self._quick = 0  # wire bytes of pieces that came back well within the timer (<0: one did not)

    def allowance(self, pending: int = 0) -> int | None:
        """Bytes that may be handed to the kernel now, of ``pending`` waiting: None once the ramp is over
        (no limit), 0 while the piece handed last is not acknowledged. Until a round trip was slow,
        pieces are at most ``QUICK_PIECE`` (the first piece that meets a thin link's empty bucket is one
        of them, and TCP resends it), and a packet's rest of up to that goes whole: a piece that ends
        inside a packet waits for the peer's delayed acknowledgement (40 ms on Linux)."""
        if self.done:
            return None
        st = self._state()
        if st is None:
            self.done = True
            return None
        if st.unacked or st.notsent:
            return 0
        full = min(st.mss, FULL)
        if self._piece:  # acknowledged since: its round trip says what the link carries
            took = self._clock() - st.since_ack - self._sent_at
            if self._piece >= MIN_PIECE or not self._rate:  # a PINGREQ's round trip is mostly the ACK's
                self._rate = (self._piece + HEADERS) / max(took, 1e-3)
                self._last = self._piece
            if took <= SHARE * st.rto:
                self._quick += self._piece + HEADERS  # back well within the timer (a burst, or a fast link)
            else:
                self._quick = -(1 << 30)  # a slow round trip: a thin link
            log.debug("ramp: piece of %d bytes back after %.3fs (TCP's timer %.2fs)", self._piece, took, st.rto)
            self._piece = 0
        if self._quick >= QUICK_BYTES:
            self.done = True  # more than a burst lends came back quickly: a fast link
            log.debug("ramp over after %d pieces, all back quickly (a fast link)", self.pieces)
            return None
        if self._quick >= 0:  # nothing slow yet: a burst, or a fast link not yet told apart from one
            if 0 < pending <= QUICK_PIECE:
                return pending  # the rest of a packet, whole: not a piece ending inside it
            return FIRST if not self._last else QUICK_PIECE
        fit = int(SHARE * st.rto * self._rate) - HEADERS
        if fit >= full:  # the timer covers a full segment: whole segments, as many as it covers
            return fit // full * full
        return max(MIN_PIECE, min(fit, 2 * max(self._last, FIRST // 2)))

    def quick(self) -> bool:
        """Whether the ramp lasts and every piece so far came back well within TCP's timer (a burst, or a
        fast link not yet told apart from one): a packet acknowledged now measures nothing of the link,
        whose time is the peer's delayed acknowledgements of its pieces (forward/link_meter.py)."""
        if self.done or not self.pieces:
            return False
        self.allowance()  # takes in an acknowledgement that came since the last look
        return not self.done and self._quick >= 0

    def sent(self, size: int) -> None:
        """``size`` bytes were handed to the kernel (one piece)."""
        if size > 0 and not self.done:
            self._piece = size
            self._sent_at = self._clock()
            self.pieces += 1
