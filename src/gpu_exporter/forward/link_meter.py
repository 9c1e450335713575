"""What the link to the broker carries, and how much the agent may put on it at once (see
docs/forwarding.md, "Weak links" and "Pacing").

**Capacity.** Each PUBACK acknowledges a PUBLISH packet (its bytes counted with the MQTT framing). The
time it took counts from the previous PUBACK, or, when nothing was in flight before it, from the publish
less the link's latency (the round trip of the tiny status message the agent sends first on each
connection, which a window of batches in flight would hide). Bytes over busy time across the latest
``_SPAN`` acknowledgements (a ratio of sums, steadier than an average of ratios) is what the link
delivers when the agent keeps it fed; idle time between packets does not dilute it. A PUBACK that took
little more than the latency says only that the link has room: it measures no capacity.

**Pacing.** Everything the agent writes waits in its socket and on the link until the link has carried
it, and a PINGREQ written behind it waits as long: on a thin link a few kilobytes are minutes. So what is
unacknowledged never exceeds what the link carries in ``PACE`` of the keepalive (``window()``), and no
packet is larger than ``PACKET`` of it (``packet_cap()``; such a packet goes alone, and cutting a summary
to the window would cost each part its headers): the keepalive's PINGRESP comes back in time on a saturated
uplink, and a PUBACK that is much later than that means the broker is not acknowledging
(forward/sender.py). Nor, beyond one packet, more than the link carries within TCP's own retransmission
timeout (read from the socket, ``TCP_INFO``): early on a connection that timer rests on round trips of
tiny packets (the handshake, a burst) and is far shorter than a thin link takes for a segment, and data
behind it would be sent twice by TCP, each full segment costing the link ten seconds at 150 B/s. The
capacity decides only once ``TRUSTED`` of the keepalive's worth of busy time stands behind it: a link's
burst (a token bucket, a radio's scheduler) lets the first packets after an idle time through far faster
than the link's rate, and one such packet would size the window for a link many times faster. Until
then the window starts at ``FIRST_WINDOW`` bytes and doubles with each PUBACK that came back in a
quarter of the time the window allows (a fast link opens it in a few round trips, as TCP's slow start
does); a PUBACK timeout, or a connection lost with packets in flight, halves it. Until the window is
trusted or has opened to ``OPEN`` (a fast link), one packet at a time: a packet that rode a thin link's
burst comes back at once and says nothing of the link, and two written behind it would take the link
far past TCP's young timer.

A halving (a PUBACK timeout, a connection lost with packets in flight) is a guess, not a measurement:
the first PUBACK after it that met no queue on the link (it took no more than the latency) undoes it,
as TCP undoes a retransmission timeout that proves spurious. Otherwise, on a link where full resolution
needs between half and 90 % of the capacity, summaries alone, each on an idle link and measuring
nothing, kept the halved figure forever: the agent summarised for good and the raw backlog never went.

**Floor.** A decision that lasts (whether a backlog goes coarse first on reconnect) rests on the least
capacity figure over the latest ``_FLOOR_SPAN`` acknowledgements (``floor()``), never on the latest one:
one packet that rode a burst, or whose round trip hid in the status message's latency, can read several
times the link's rate, and a backlog sent raw on such a figure keeps an outage invisible until it has
drained. After a reconnect the link carries no more than before it (TCP starts slow, and a burst only
lends what the idle link saved), so the figures from before the outage stand.

**Need.** What full resolution needs is the payload bytes of the latest raw batches closed over the time
they cover (a short batch, closed early by a reconnect or an event, weighs little). Full resolution fits
while it needs at most ``HEADROOM`` of the capacity (and of ``--mqtt.max-rate``, when set); otherwise the
forwarder sends summaries first.
"""

from __future__ import annotations

import logging
import math
from collections import deque

from prometheus_client import CollectorRegistry, Gauge

__all__ = ["FIRST_WINDOW", "HEADROOM", "LEAVE", "MIN_WINDOW", "OPEN", "PACE", "PACKET", "TRUSTED", "LinkMeter"]

log = logging.getLogger("gpu_exporter.forward")

HEADROOM = 0.9  # full resolution must fit in this share of the capacity
LEAVE = 0.7  # ... and in this share to end summarising once it started (hysteresis)
PACE = 0.7  # what may be unacknowledged: what the link carries in this share of the keepalive
PACKET = 0.9  # the largest packet: what the link carries in this share (alone, a PINGRESP still comes in time)
FIRST_WINDOW = 1024  # bytes unacknowledged before the link was measured (10 s of a 100 B/s link)
TRUSTED = 0.2  # of the keepalive: busy time the capacity must rest on before it sizes the window
MIN_WINDOW = 512  # the least the window shrinks to after PUBACK timeouts
OPEN = 16 * 1024  # an unmeasured window this large (opened by quick PUBACKs: a fast link) takes more than one packet
_SPAN = 4  # acknowledgements the capacity is measured over
_FLOOR_SPAN = 16  # capacity figures (one per acknowledgement that measured the link) the floor is the least of
_ALPHA = 0.3  # weight of the newest round trip in the smoothed round-trip time


class LinkMeter:
    """Measurements of one agent's link; ``clock`` times are passed in (monotonic seconds)."""

    def __init__(self, registry: CollectorRegistry | None, max_rate: float = 0.0, keepalive: float = 30.0) -> None:
        self.max_rate = max_rate
        self.keepalive = keepalive
        self.capacity = 0.0  # acknowledged packet bytes per busy second, 0 until measured
        self.rtt = 0.0  # seconds from publish to PUBACK, 0 until measured
        self.acks = 0  # PUBACKs seen
        self.first_window = FIRST_WINDOW  # the window until measured; halved by each PUBACK timeout
        self.tcp_rto = 0.0  # TCP's retransmission timeout on the connection, seconds (0: not known)
        self._busy: deque[tuple[int, float]] = deque(maxlen=_SPAN)  # (bytes, busy seconds) of the latest acks
        self._figures: deque[float] = deque(maxlen=_FLOOR_SPAN)  # the capacity after each of the latest acks
        # what was measured before the latest halvings (timed_out), until the link is measured again
        self._halved: tuple[float, deque[tuple[int, float]], deque[float]] | None = None
        self._produced: deque[tuple[int, float]] = deque(maxlen=8)  # (bytes, seconds) of the latest batches
        self.need = 0.0  # payload bytes per second full resolution takes, 0 until measured
        self._sent: dict[int, tuple[float, int, bool]] = {}  # mid -> (publish time, bytes, link was idle)
        self._inflight = 0  # bytes of what is in ``_sent``
        self._mark = -math.inf  # the previous PUBACK, or the publish that started a busy period
        self._tokens = 0.0  # bytes --mqtt.max-rate allows now (negative: wait)
        self._tokens_at = -math.inf
        self._bytes_g: Gauge | None = None
        self._rtt_g: Gauge | None = None
        self._need_g: Gauge | None = None
        self._window_g: Gauge | None = None
        self.summarizing: Gauge | None = None
        self.summary_window: Gauge | None = None
        if registry is not None:
            p = "gpu_exporter_forward_"
            self._bytes_g = Gauge(
                p + "link_bytes_per_second",
                "Bytes per second the broker acknowledged while the link was busy (MQTT packets, over the "
                "latest acknowledgements); 0 until measured.",
                registry=registry,
            )
            self._rtt_g = Gauge(
                p + "ack_rtt_seconds", "Time from publish to PUBACK (EWMA); 0 until measured.", registry=registry
            )
            self._need_g = Gauge(
                p + "full_resolution_bytes_per_second",
                "Payload bytes per second that full-resolution batches take (the latest 8 batches).",
                registry=registry,
            )
            self._window_g = Gauge(
                p + "pacing_window_bytes",
                "Most bytes unacknowledged at once, and the largest packet: what the link carries in a share "
                "of the MQTT keepalive.",
                registry=registry,
            )
            self.summarizing = Gauge(
                p + "summarizing",
                "1 while full resolution does not fit the link (or --mqtt.max-rate) and summaries go first.",
                registry=registry,
            )
            self.summary_window = Gauge(
                p + "summaries_window_seconds",
                "Length of the last fresh summary's window while summarising (0 when not): as long as the link requires.",
                registry=registry,
            )
            self._export()

    # ------------------------------------------------------------------------------------ measuring

    def sent(self, mid: int, size: int, now: float) -> None:
        """A PUBLISH of ``size`` bytes (the whole packet) went to the socket."""
        idle = not self._sent
        if idle:
            self._mark = now  # the link was idle: this publish starts a busy period
        self._sent[mid] = (now, size, idle)
        self._inflight += size
        log.debug("publish %d: %d bytes, %d in flight, window %d", mid, size, self._inflight, self.window())
        if self.max_rate:
            self.allowed(now)
            self._tokens -= size

    def acked(self, mid: int, now: float, latency: float = 0.0) -> None:
        """A PUBACK; ``latency`` is the round trip of a message too small to take transfer time (the
        status message's, sent first on each connection), 0 when not known."""
        found = self._sent.pop(mid, None)
        if found is None:
            return
        published, size, idle_before = found
        self._inflight -= size
        self.acks += 1
        rtt = max(0.0, now - published)
        self.rtt = rtt if not self.rtt else (1 - _ALPHA) * self.rtt + _ALPHA * rtt
        busy = now - max(self._mark, published)
        self._mark = now
        room = False
        if idle_before:  # nothing else was in flight: its round trip is in ``busy``, which a window hides
            busy -= min(latency, rtt)
            if busy <= 0.1 * rtt:
                busy, room = 0.0, True  # the latency is all there is to see: the link has room, how much is unknown
        log.debug("puback %d: %d bytes after %.2fs (busy %.2fs)", mid, size, rtt, busy)
        if busy > 1e-3:
            self._busy.append((size, busy))
            self.capacity = sum(b for b, _ in self._busy) / sum(t for _, t in self._busy)
            self._figures.append(self.capacity)
            self._halved = None  # measured again: the new figures stand
        elif room and self._halved is not None:  # it met no queue: the halving was not needed, undo it
            self.capacity, self._busy, self._figures = self._halved
            self._halved = None
        if not self._trusted() and rtt <= PACE * self.keepalive / 4:
            self.first_window = min(1 << 30, self.first_window * 2)  # it came back quickly: open up
        self._export()

    def lost(self) -> None:
        """The connection dropped: what was in flight is not acknowledged. A link that died with packets
        on it was probably given more than it carries: the window halves, as after a PUBACK timeout."""
        if self._sent:
            self.timed_out()
        self._sent.clear()
        self._inflight = 0

    def timed_out(self) -> None:
        """PUBACKs stopped coming for what the window allowed: assume half the link (as TCP halves its
        window on a timeout) until it is measured again."""
        if self._halved is None:
            self._halved = (self.capacity, self._busy, self._figures)
        self.capacity /= 2
        self._busy = deque(((b, 2 * t) for b, t in self._busy), maxlen=_SPAN)  # what it rests on, halved too
        self._figures = deque((c / 2 for c in self._figures), maxlen=_FLOOR_SPAN)
        self.first_window = max(MIN_WINDOW, self.first_window // 2)
        self._export()

    def produced(self, size: int, span: float) -> None:
        """A full-resolution batch of ``size`` payload bytes covering ``span`` seconds was closed."""
        if span <= 0:
            return
        self._produced.append((size, span))
        self.need = sum(b for b, _ in self._produced) / sum(t for _, t in self._produced)
        self._export()

    def _export(self) -> None:
        if self._bytes_g is not None and self._rtt_g is not None and self._need_g is not None:
            self._bytes_g.set(self.capacity)
            self._rtt_g.set(self.rtt)
            self._need_g.set(self.need)
        if self._window_g is not None:
            self._window_g.set(self.window())

    # ------------------------------------------------------------------------------------ deciding

    def budget(self) -> float:
        """Bytes per second the agent may use: the measured capacity within --mqtt.max-rate (0: unknown)."""
        return self._capped(self.capacity)

    def floor(self) -> float:
        """Bytes per second the link carried at least, over the latest capacity figures, within
        --mqtt.max-rate (0: unknown): what a lasting decision rests on (see the module doc)."""
        return self._capped(min(self._figures, default=0.0))

    def _capped(self, figure: float) -> float:
        caps = [c for c in (figure, self.max_rate) if c > 0]
        return min(caps) if caps else 0.0

    def weak(self, cap: float = 0.0, headroom: float = HEADROOM) -> bool:
        """Whether full resolution does not fit what the link carries (or --mqtt.max-rate allows, or
        ``cap`` bytes per second when given) with ``headroom`` to spare."""
        budget = min(self.budget(), cap) if cap and self.budget() else self.budget()
        return bool(budget and self.need > headroom * budget)

    def _trusted(self) -> bool:
        return sum(t for _, t in self._busy) >= TRUSTED * self.keepalive

    def window(self) -> int:
        """Bytes that may be unacknowledged at once (see the module doc)."""
        if not self._trusted():
            return self.first_window
        window = self.capacity * PACE * self.keepalive
        # nor more than TCP's timer allows: fewer spurious retransmissions. Only where TCP sees a slow path
        # itself: on loopback, or behind a proxy, its timer stays near its 200 ms minimum, and a capacity
        # measured low on a loaded machine would shrink the window to a packet for nothing.
        if self.tcp_rto >= 1.0:
            window = min(window, self.capacity * self.tcp_rto)
        return max(MIN_WINDOW, int(window))

    def packet_cap(self) -> int:
        """The largest packet to send now: what the link carries in ``PACKET`` of the keepalive (a larger
        one would hold a PINGREQ written behind it past the keepalive). A packet over the window goes
        alone; cutting it to the window would only add each part's headers (some 500 bytes a part for a
        summary of 8 GPUs: 3-4 s at 150 B/s), and TCP's timer does not cut packets either."""
        if self._trusted():
            return max(MIN_WINDOW, int(self.capacity * PACKET * self.keepalive))
        return self.first_window

    def room(self, size: int) -> bool:
        """Whether a packet of ``size`` bytes may go now: within the window with what is in flight, or
        alone (the forwarder cuts packets to the window: only one made before the window shrank is larger)."""
        if not self._sent:
            return True
        if not self._trusted() and self.first_window < OPEN:
            return False  # one packet at a time until the link is measured or proved fast (module doc)
        return self._inflight + size <= self.window()

    def inflight_bytes(self) -> int:
        return self._inflight

    def oldest(self) -> float | None:
        """When the oldest packet still unacknowledged was published (None: nothing in flight)."""
        return min((t for t, _, _ in self._sent.values()), default=None)

    def seconds_for(self, size: int) -> float:
        """Time until ``size`` more bytes are acknowledged, behind what is in flight (0: unknown)."""
        budget = self.budget()
        return (self._inflight + size) / budget if budget else 0.0

    def allowed(self, now: float) -> bool:
        """Whether --mqtt.max-rate lets a publish go now (always, with no cap). The bucket holds one
        second's worth: a batch larger than that goes, and the next one waits until it is paid for."""
        if not self.max_rate:
            return True
        if self._tokens_at == -math.inf:
            self._tokens = self.max_rate
        else:
            self._tokens = min(self.max_rate, self._tokens + (now - self._tokens_at) * self.max_rate)
        self._tokens_at = now
        return self._tokens > 0
