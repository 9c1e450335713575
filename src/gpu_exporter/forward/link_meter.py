"""What the link to the broker carries: acknowledged bytes per second, PUBACK round-trip time, and the
``--mqtt.max-rate`` cap; from them, whether full resolution fits (see docs/forwarding.md, weak links).

Capacity is measured while the link is busy: each PUBACK acknowledges a payload, and the time it took
counts from the previous PUBACK, or, when nothing was in flight before it, from the publish less the
link's latency (the round trip of the tiny status message the agent sends first on each connection,
which a window of batches in flight would hide); a PUBACK that took little more than the latency
says only that the link has room, and measures nothing. Bytes over
busy time, smoothed (EWMA), is what the link delivers when the agent keeps it fed; idle time between
batches does not dilute it. What full resolution needs is the payload bytes of the latest raw batches
closed over the time they cover (a short batch, closed early by a reconnect or an event, weighs little). Full resolution fits while it needs at most 90 % of the
capacity (and of ``--mqtt.max-rate``, when set); otherwise the forwarder sends summaries first.
"""

from __future__ import annotations

import math
from collections import deque

from prometheus_client import CollectorRegistry, Gauge

__all__ = ["HEADROOM", "LinkMeter"]

HEADROOM = 0.9  # full resolution must fit in this share of the capacity
_ALPHA = 0.3  # weight of the newest measurement


class LinkMeter:
    """Measurements of one agent's link; ``clock`` times are passed in (monotonic seconds)."""

    def __init__(self, registry: CollectorRegistry | None, max_rate: float = 0.0) -> None:
        self.max_rate = max_rate
        self.capacity = 0.0  # acknowledged bytes per busy second, 0 until measured
        self.rtt = 0.0  # seconds from publish to PUBACK, 0 until measured
        self.acks = 0  # PUBACKs seen
        self._produced: deque[tuple[int, float]] = deque(maxlen=8)  # (bytes, seconds) of the latest batches
        self.need = 0.0  # payload bytes per second full resolution takes, 0 until measured
        self._sent: dict[int, tuple[float, int, bool]] = {}  # mid -> (publish time, payload bytes, link was idle)
        self._mark = -math.inf  # the previous PUBACK, or the publish that started a busy period
        self._tokens = 0.0  # bytes --mqtt.max-rate allows now (negative: wait)
        self._tokens_at = -math.inf
        self._bytes_g: Gauge | None = None
        self._rtt_g: Gauge | None = None
        self._need_g: Gauge | None = None
        self.summarizing: Gauge | None = None
        if registry is not None:
            p = "gpu_exporter_forward_"
            self._bytes_g = Gauge(
                p + "link_bytes_per_second",
                "Payload bytes per second the broker acknowledged while batches were in flight (EWMA); "
                "0 until measured.",
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
            self.summarizing = Gauge(
                p + "summarizing",
                "1 while full resolution does not fit the link (or --mqtt.max-rate) and summaries go first.",
                registry=registry,
            )

    # ------------------------------------------------------------------------------------ measuring

    def sent(self, mid: int, size: int, now: float) -> None:
        idle = not self._sent
        if idle:
            self._mark = now  # the link was idle: this publish starts a busy period
        self._sent[mid] = (now, size, idle)
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
        self.acks += 1
        rtt = max(0.0, now - published)
        self.rtt = rtt if not self.rtt else (1 - _ALPHA) * self.rtt + _ALPHA * rtt
        busy = now - max(self._mark, published)
        self._mark = now
        if idle_before:  # nothing else was in flight: its round trip is in ``busy``, which a window hides
            busy -= min(latency, rtt)
            if busy <= 0.1 * rtt:
                busy = 0.0  # the latency is all there is to see: the link has room, how much is unknown
        if busy > 1e-3:
            rate = size / busy
            self.capacity = rate if not self.capacity else (1 - _ALPHA) * self.capacity + _ALPHA * rate
        self._export()

    def lost(self) -> None:
        """The connection dropped: what was in flight is not acknowledged."""
        self._sent.clear()

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

    # ------------------------------------------------------------------------------------ deciding

    def budget(self) -> float:
        """Bytes per second the agent may use: the measured capacity within --mqtt.max-rate (0: unknown)."""
        caps = [c for c in (self.capacity, self.max_rate) if c > 0]
        return min(caps) if caps else 0.0

    def weak(self) -> bool:
        """Whether full resolution does not fit what the link carries (or --mqtt.max-rate allows)."""
        budget = self.budget()
        return bool(budget and self.need > HEADROOM * budget)

    def inflight_bytes(self) -> int:
        return sum(size for _, size, _ in self._sent.values())

    def seconds_for(self, size: int) -> float:
        """Time until ``size`` more bytes are acknowledged, behind what is in flight (0: unknown)."""
        budget = self.budget()
        return (self.inflight_bytes() + size) / budget if budget else 0.0

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
