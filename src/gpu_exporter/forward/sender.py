"""Sending and acknowledgements, the half of ``Forwarder`` that talks to the broker (service.py).

What goes next on the link: summaries first while the link is weak (``adaptive.Adaptive``), then the
fresh batches, then the backlog at ``--spool.replay-rate`` batches per second; each within the in-flight
window, the pacing window (``link_meter.LinkMeter``) and what the broker takes in one packet. A batch over
the broker's Maximum Packet Size is spooled again as parts that fit; one over what the link carries at
once is cut in memory and sent part by part. A PUBACK removes a batch from the spool; a refusal holds
every publish for a backoff; a broker that acknowledges nothing for twice the keepalive is given up.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpu_exporter.config import Config
from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.forward_metrics import ForwardMetrics
from gpu_exporter.forward.health import HealthReports
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.forward.prepare import OpenBatch
from gpu_exporter.forward.spool import Spool
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.model import Sample
from gpu_exporter.mqtt.packet import payload_budget, publish_size
from gpu_exporter.payload import PayloadError, decode, verify
from gpu_exporter.payload.split import split

__all__ = ["ACK_TIMEOUT", "Sender"]

log = logging.getLogger("gpu_exporter.forward")

ACK_TIMEOUT = 2.0  # keepalives without the PUBACK of a batch in flight before the broker counts as silent
_LOG_EVERY = 60.0


class Sender:
    """Mixed into ``Forwarder``, whose constructor sets what is declared here (one thread uses it all)."""

    config: Config
    topic: str
    link: Link
    spool: Spool
    meter: LinkMeter
    adaptive: Adaptive
    reports: HealthReports
    metrics: ForwardMetrics
    _clock: Callable[[], float]
    _open: OpenBatch
    _inflight: dict[int, Entry]
    _live: deque[Entry]
    _cutting: dict[str, deque[bytes]]
    _parts_out: dict[str, set[int]]
    _tokens: float
    _tokens_at: float
    _hold_until: float
    _refusals: int
    _error_logged: dict[str, float]
    _stalled: str
    _too_large_logged: bool

    if TYPE_CHECKING:  # the batching half, in service.py

        def _span(self) -> float: ...

        def _store(
            self,
            samples: list[Sample],
            journal: list[str],
            node: str = "",
            boot: str = "",
            hard: int = 0,
            part: str = "",
        ) -> list[Entry]: ...

        def _dropped(self, reason: str, batches: int, samples: int) -> None: ...

    def _hard_limit(self, pace: bool = False) -> int:
        """Largest payload that may ever be published: within the broker's Maximum Packet Size and, with
        ``pace``, within what the link carries at once (``Link.packet_limit``); 0 when neither is known."""
        packet = self.link.packet_limit() if pace else self.link.max_packet
        return payload_budget(self.topic, packet, self.link.v5) if packet else 0

    def _sendable(self) -> bool:
        busy = len(self._inflight) + len(self.adaptive.inflight) + len(self.reports.inflight)
        if not self.link.up or busy >= self.link.capacity() or self._clock() < self._hold_until:
            return False
        if not self.meter.allowed(self._clock()) or self.meter.inflight_bytes() >= self.meter.window():
            return False  # --mqtt.max-rate, or the link holds what it can carry within the keepalive
        report = self.reports.pending
        if report is not None and not self.adaptive.fresh_waiting():
            return not self.link.fits(self.topic, len(report)) or self.meter.room(
                self.link.packet_size(self.topic, len(report))
            )
        if self.adaptive.waiting():
            return self.adaptive.can_send(self.link, self.topic)
        if self.adaptive.active:
            return False  # a raw batch goes on a weak link only as room allows: checked each turn
        entry = self._live[0] if self._live else None
        if entry is not None and entry.key in self._cutting:
            parts = self._cutting[entry.key]
            return not parts or self.meter.room(self.link.packet_size(self.topic, len(parts[0])))
        if entry is None and len(self.spool) > len(self._inflight) and self._tokens >= 1:
            entry = self._next_backlog(self.spool.pinned)
        if entry is None:
            return False
        # a batch to cut is work to do now; one that fits waits for room in the pacing window
        return not self.link.fits(self.topic, entry.size) or self.meter.room(
            self.link.packet_size(self.topic, entry.size)
        )

    def _send(self) -> None:
        now = self._clock()
        rate = self.config.spool_replay_rate
        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        inflight = self.spool.pinned  # keys of the batches in flight (the spool's caps pass over them)
        if now < self._hold_until:
            return  # the broker refused a batch: wait before trying again
        # The agent's health goes first (health.py); with a fresh summary, right behind it in its delivery
        # (adaptive.py), which then measures the link over both.
        free = self.link.capacity() - self._busy()
        if not self.adaptive.fresh_waiting() and not self.reports.send(self.link, self.topic, self.meter, now, free):
            return
        if not self.adaptive.send(
            self.link,
            self.topic,
            self.link.capacity() - len(self._inflight) - len(self.reports.inflight),
            now,
            lead=self.reports.take,
        ):
            return  # summaries go before anything else
        if self.adaptive.active:  # when the next summary is due
            until_next = self.adaptive.next_due(time.time())
        else:
            until_next = self._open.opened + self._span() - now
        while self.link.up and self._busy() < self.link.capacity():
            backlog = not self._live
            if backlog:
                if self._tokens < 1:
                    break
                found = self._next_backlog(inflight | {e.key for e in self._live})
                if found is None:
                    break
                entry = found
            else:
                entry = self._live[0]
                if entry.key in self._cutting:
                    if not self._send_part(entry, now, until_next):
                        break
                    continue
                if entry not in self.spool or entry.key in inflight:
                    self._live.popleft()
                    continue
            packet = self.link.packet_size(self.topic, entry.size)
            if self.link.fits(self.topic, entry.size) and (
                not self.adaptive.raw_allowed(entry.size, now, until_next) or not self.meter.room(packet)
            ):
                break  # it waits for room (a batch that does not fit is cut below, before anything is sent)
            if backlog:
                self._tokens -= 1
            else:
                self._live.popleft()
            data = self.spool.get(entry)
            if data is None:
                continue
            try:
                verify(data)  # zlib checksum and length: what a damaged file or a torn write breaks
            except PayloadError as exc:
                self.spool.quarantine(entry, data, str(exc))
                continue
            if self.link.max_packet and not self._fits_broker(len(data)):
                self._live.extendleft(reversed(self._resplit(entry, data)))  # the parts go next
                continue
            if not self.link.fits(self.topic, len(data)):
                self._cut(entry, data)  # what the link carries at once: parts from memory, next
                inflight.add(entry.key)
                continue
            mid = self.link.publish(self.topic, data)
            if mid is None:
                if self.link.refused_publish != "queue full":  # a full queue is retried, not an error
                    self.metrics.publish_errors.inc()
                if not backlog:
                    self._live.appendleft(entry)
                break
            self._inflight[mid] = entry
            self.meter.sent(mid, packet, now)
            inflight.add(entry.key)

    def _busy(self) -> int:
        """Publishes awaiting their PUBACK: batches, summaries and health reports (within Receive Maximum)."""
        return len(self._inflight) + len(self.adaptive.inflight) + len(self.reports.inflight)

    def _fits_broker(self, payload: int) -> bool:
        return publish_size(self.topic, payload, self.link.v5) <= self.link.max_packet

    def _cut(self, entry: Entry, data: bytes) -> None:
        """A spooled batch over what the link carries at once: cut in memory and sent part by part; it
        leaves the spool when every part is acknowledged (a connection lost meanwhile: it goes again, cut
        as the link of that moment requires; the bridge drops the parts it has by their names)."""
        try:
            batch = decode(data)
        except PayloadError as exc:
            self.spool.quarantine(entry, data, str(exc))
            return
        parts, unfit = split(batch, self._hard_limit(pace=True))
        for sample, size in unfit:
            self._too_large(sample, size, self._hard_limit(pace=True))
        self._cutting[entry.key] = deque(d for _, d in parts)
        self._parts_out[entry.key] = set()
        if self._live and self._live[0] is entry:
            return
        self._live.appendleft(entry)

    def _send_part(self, entry: Entry, now: float, until_next: float) -> bool:
        """Publish the next part of a batch cut in memory; False when it must wait."""
        parts = self._cutting[entry.key]
        if not parts:  # nothing left to publish (every part was left out as too large)
            del self._cutting[entry.key]
            self._live.popleft()
            if not self._parts_out.get(entry.key):
                self._parts_out.pop(entry.key, None)
                self.spool.pinned.discard(entry.key)
                self.spool.remove(entry)
            return True
        data = parts[0]
        packet = self.link.packet_size(self.topic, len(data))
        if not self.adaptive.raw_allowed(len(data), now, until_next) or not self.meter.room(packet):
            return False
        mid = self.link.publish(self.topic, data)
        if mid is None:
            if self.link.refused_publish != "queue full":
                self.metrics.publish_errors.inc()
            return False
        parts.popleft()
        self._parts_out[entry.key].add(mid)
        self._inflight[mid] = entry
        self.meter.sent(mid, packet, now)
        if not parts:
            del self._cutting[entry.key]
            self._live.popleft()
        return True

    def _resplit(self, entry: Entry, data: bytes) -> list[Entry]:
        """A spooled batch over what may be published now (the broker's Maximum Packet Size, or what the
        link carries at once): spool it again as parts that fit (written before the original goes, so that
        a crash in between repeats samples, never loses them)."""
        try:
            batch = decode(data)
        except PayloadError as exc:
            self.spool.quarantine(entry, data, str(exc))
            return []
        hard = self._hard_limit(pace=True)
        self.spool.pinned.add(entry.key)  # the caps pass over it while its parts are written
        try:
            parts = self._store(list(batch.samples), [], batch.node, batch.boot, hard=hard, part=batch.part)
        finally:
            self.spool.pinned.discard(entry.key)
        self.spool.remove(entry)
        limit = self.link.packet_limit()
        why = "the broker's Maximum Packet Size" if limit == self.link.max_packet else "what the link carries at once"
        log.info(
            "batch %d-%d (%d bytes) is over %s (%d bytes): sent as %d part(s)",
            entry.first_seq,
            entry.last_seq,
            entry.size,
            why,
            limit,
            len(parts),
        )
        return parts

    def _too_large(self, sample: Sample, size: int, limit: int) -> None:
        self._dropped("too_large", 0, 1)
        if not self._too_large_logged:
            self._too_large_logged = True
            need = self.link.packet_limit() - limit + size
            log.error(
                "one value of sample %d takes %d bytes as a payload, over the %d bytes a packet may carry "
                "(the broker's Maximum Packet Size of %d bytes): dropped (gpu_exporter_forward_dropped_samples_total"
                '{reason="too_large"}); raise the broker\'s maximum packet size (Mosquitto: max_packet_size) '
                "to at least %d",
                sample.seq,
                size,
                limit,
                self.link.max_packet,
                need,
            )

    def _refusal(self, reason: str, what: str) -> None:
        """The broker refused a publish. Not authorized, quota exceeded, topic invalid...: the same batch
        at once would be refused again. Hold every publish for a while (doubling up to
        --mqtt.reconnect-max-delay); one line a minute per reason."""
        self.metrics.publish_errors.inc()
        self.metrics.refused.inc()
        now = self._clock()
        if now >= self._hold_until:  # the rest of a refused window does not lengthen the wait again
            self._refusals += 1
            delay = min(self.config.mqtt_reconnect_max_delay, 1.0 * 2 ** min(self._refusals - 1, 10))
            self._hold_until = now + delay
        self._live.clear()  # the backlog order sends the refused batch first again
        if now - self._error_logged.get(reason, -math.inf) >= _LOG_EVERY:
            self._error_logged[reason] = now
            log.warning(
                "broker refused %s: %s; retrying in %.1fs (then with backoff, batches kept in the spool)",
                what,
                reason,
                self._hold_until - now,
            )

    def _check_acks(self, now: float) -> None:
        """A broker that takes batches and never acknowledges them (PUBACK) would keep them in flight
        forever, the connection looking healthy. In flight is never more than the link carries within the
        keepalive, so a PUBACK overdue by twice the keepalive means the broker is not answering: the
        connection is given up, the batches go again on a new one, and /readyz says so until a PUBACK
        comes."""
        oldest = self.meter.oldest()
        if oldest is None or not self.link.up:
            return
        waited = now - oldest
        if waited < ACK_TIMEOUT * self.link.settings.keepalive:
            return
        count = self._busy()
        self._stalled = (
            f"broker at {self.link.settings.host}:{self.link.settings.port} acknowledged none of {count} "
            f"batch(es) in flight for {waited:.0f}s (no PUBACK)"
        )
        self.metrics.working.set(0)  # at once, as /readyz says it (housekeeping sets it each second)
        self.link.abort("timeout", f"{self._stalled}; reconnecting, the batches stay in the spool and go again")

    def _next_backlog(self, exclude: set[str]) -> Entry | None:
        for entry in self.spool.entries_view():
            if entry.key not in exclude:
                return entry
        return None

    def _acked(self, mid: int, ok: bool, reason: str) -> None:
        # a packet whose pieces all came back quickly (a burst, or a fast link still in the young
        # connection's ramp) took the peer's delayed acknowledgements, not the link's time: no figure; nor
        # does a health report alone on the link (a few hundred bytes: its round trip is the latency)
        quick = self.link.ramp_quick() or mid in self.reports.inflight
        self.meter.acked(mid, self._clock(), math.inf if quick else self.link.status_rtt)
        self._stalled = ""  # the broker answers
        if self.reports.acked(mid):  # a health report: nothing in the spool; refused, it is not sent again
            if not ok:
                self._refusal(reason, "a health report")
            return
        if self.adaptive.acked(mid, self._clock()):
            return  # a summary: nothing in the spool to remove (a refused one is not sent again)
        entry = self._inflight.pop(mid, None)
        if entry is None:
            return  # the status message, or a batch of a connection already given up
        out = self._parts_out.get(entry.key)
        if out is not None:  # a part of a batch cut in memory
            out.discard(mid)
            if ok and (out or entry.key in self._cutting):
                return  # more parts to come
            self._parts_out.pop(entry.key, None)
            if not ok:  # the batch goes again, whole, after the pause below
                for other in out:  # the acknowledgements of its other parts no longer count
                    self._inflight.pop(other, None)
                self._cutting.pop(entry.key, None)
                if self._live and self._live[0] is entry:
                    self._live.popleft()
        self.spool.pinned.discard(entry.key)
        if not ok:
            self._refusal(reason, f"batch {entry.first_seq}-{entry.last_seq}")
            return
        self._refusals = 0
        self.spool.remove(entry)
        self.metrics.batches.inc()
        self.metrics.samples.inc(entry.samples)
        self.metrics.bytes.inc(entry.size)
