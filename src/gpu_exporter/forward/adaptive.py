"""Adaptive forwarding: summaries first while full resolution does not fit the link.

The forwarder asks this module three things (docs/forwarding.md, "Weak links"):

- ``closed``: a full-resolution batch was closed and spooled. While the link is weak (``LinkMeter.weak``)
  its samples are added to the open summary window and the batch waits in the spool's backlog instead
  of going ahead as a fresh batch. A summary is emitted once the window covers ``factor`` batch
  intervals; the factor doubles (up to 16) while summaries take over three quarters of what the link
  carries and halves again when they take under a quarter: the window grows as the link shrinks.
- ``backlog``: on reconnect, when the spool holds more than two batch intervals' worth of what the link
  carries, each spooled batch (up to ``MAX_BACKLOG``, oldest first) becomes one summary point, and
  neighbouring points merge into wider windows until all of them take the link at most
  ``COARSE_SECONDS``: an outage is visible coarse before its full resolution has drained.
- ``raw_allowed``: whether a full-resolution batch may be published now. With ``--mqtt.max-rate`` only
  what the rate allows; while weak, only if its PUBACK is due before the next summary, so that a raw
  batch never delays fresh data.

Summaries live in memory only (the raw batches they summarise stay in the spool); what the broker did
not acknowledge when the connection dropped is summarised again from the spool on reconnect.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from gpu_exporter.forward.batch import PayloadError, decode
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.forward.spool import Entry
from gpu_exporter.forward.summary import encode_summary, merge, summarize
from gpu_exporter.model import Sample

__all__ = ["COARSE_SECONDS", "MAX_BACKLOG", "MAX_FACTOR", "Adaptive"]

log = logging.getLogger("gpu_exporter.forward")

MAX_FACTOR = 16  # longest summary window, in batch intervals
MAX_BACKLOG = 4096  # spooled batches summarised on reconnect
_POINTS = 64  # summary points per backlog summary batch
COARSE_SECONDS = 30.0  # the summaries of a backlog take the link this long at most (windows widen to fit)


class Adaptive:
    def __init__(self, node: str, boot: str, meter: LinkMeter, interval: float) -> None:
        self.node = node
        self.interval = interval  # --mqtt.batch-interval
        self.boot = boot
        self.meter = meter
        self.factor = 1
        self.queue: deque[bytes] = deque()  # summary payloads, sent before anything else
        self.inflight: dict[int, int] = {}  # summaries published: mid -> bytes
        self._window: list[Sample] = []
        self._window_span = 0.0
        self.emitted = 0  # summary batches made (for tests and the log)
        self.active = False  # summarising: full resolution does not fit
        # spool key -> summary of that batch made when it was closed (None: summarised already)
        self._made: OrderedDict[str, bytes | None] = OrderedDict()

    def closed(self, samples: list[Sample], entries: list[Entry], span: float, connected: bool) -> bool:
        """A full-resolution batch was spooled as ``entries``; True when it should wait in the backlog
        (summarised). While disconnected its summary is made now, from the samples at hand, and kept
        (encoded, a few kB) for the reconnect: cheaper than reading the batch back from the spool."""
        self.meter.produced(sum(e.size for e in entries), span)
        if not connected and entries:
            self._remember(entries, encode_summary(self.node, self.boot, [summarize(samples)], span))
        weak = connected and self.meter.weak()
        self._flag(weak)
        if weak and entries:
            self._remember(entries, None)  # summarised live below: not again after an outage
        if not weak:
            self._window, self._window_span = [], 0.0
            return False
        self._window.extend(samples)
        self._window_span += span
        if self._window_span >= self.factor * self.interval * 0.999:
            data = encode_summary(self.node, self.boot, [summarize(self._window)], self._window_span)
            self.queue.append(data)
            self.emitted += 1
            self._adapt(len(data) / self._window_span)
            self._window, self._window_span = [], 0.0
        return True

    def _remember(self, entries: list[Entry], data: bytes | None) -> None:
        self._made[entries[0].key] = data
        for entry in entries[1:]:
            self._made[entry.key] = None  # covered by the first part's summary
        while len(self._made) > MAX_BACKLOG:
            self._made.popitem(last=False)

    def _adapt(self, rate: float) -> None:
        budget = self.meter.budget()
        if not budget:
            return
        if rate > 0.75 * budget and self.factor < MAX_FACTOR:
            self.factor *= 2
        elif rate < 0.25 * budget and self.factor > 1:
            self.factor //= 2

    def _flag(self, weak: bool) -> None:
        self.active = weak
        gauge = self.meter.summarizing
        if gauge is not None:
            gauge.set(1 if weak else 0)

    def backlog(self, entries: Iterable[Entry], read: Callable[[Entry], bytes | None]) -> int:
        """On reconnect: summary points of the spooled backlog when it will take long to drain; how many."""
        budget = self.meter.budget()
        listed = list(entries)
        total = sum(e.size for e in listed)
        if not budget or total <= 2 * self.interval * budget:
            return 0
        groups: dict[tuple[str, str], list[tuple[Sample, float]]] = {}
        made_before, self._made = self._made, OrderedDict()
        for entry in listed[:MAX_BACKLOG]:
            if entry.key in made_before:
                kept = made_before[entry.key]
                self._made[entry.key] = kept
                if kept is None:
                    continue
                data, summarised = kept, True
            else:
                found = read(entry)  # a batch of an earlier run, or of a connection that ended weak
                if found is None:
                    continue
                data, summarised = found, False
            try:
                batch = decode(data)
            except PayloadError:
                continue  # the send path quarantines it
            if not batch.samples or bool(batch.summary_ms) != summarised:
                continue
            if summarised:
                point, span = batch.samples[0], batch.summary_ms / 1000
            else:
                point = summarize(batch.samples)
                span = batch.samples[-1].timestamp - batch.samples[0].timestamp
            groups.setdefault((batch.node, batch.boot), []).append((point, max(span, self.interval)))
        made = 0
        for (node, boot), points in groups.items():
            points.sort(key=lambda p: p[0].seq)
            points = self._coarsen(node, boot, points, budget)
            for i in range(0, len(points), _POINTS):
                chunk = points[i : i + _POINTS]
                window = sum(span for _, span in chunk) / len(chunk)
                self.queue.append(encode_summary(node, boot, [p for p, _ in chunk], window))
                made += len(chunk)
        if made:
            self._flag(True)
            log.info("link carries %.0f B/s: %d spooled batches go first as summaries", budget, made)
        return made

    def _coarsen(
        self, node: str, boot: str, points: list[tuple[Sample, float]], budget: float
    ) -> list[tuple[Sample, float]]:
        """Fewer, wider points when the summaries of the backlog would take the link over COARSE_SECONDS."""
        probe = points[:_POINTS]
        per_point = len(encode_summary(node, boot, [p for p, _ in probe], self.interval)) / len(probe)
        k = math.ceil(len(points) * per_point / (budget * COARSE_SECONDS))
        if k <= 1:
            return points
        return [merge(points[i : i + k]) for i in range(0, len(points), k)]

    def raw_allowed(self, size: int, now: float, until_next: float) -> bool:
        """Whether a full-resolution batch of ``size`` bytes may be published now, the next batch being due
        in ``until_next`` seconds: within --mqtt.max-rate, and while weak only if its PUBACK is due before
        the next summary (what is in flight included), so that full resolution never holds fresh data back."""
        if not self.meter.allowed(now):
            return False
        return not self.active or self.meter.seconds_for(size) <= until_next

    def send(self, link: Link, topic: str, room: int, now: float) -> bool:
        """Publish queued summaries while ``room`` (in-flight slots less what is in flight) and the rate
        allow; False while some still wait."""
        queue = self.queue
        while queue and link.up and len(self.inflight) < room:
            if not self.meter.allowed(now):
                return False
            data = queue[0]
            if not link.fits(topic, len(data)):
                queue.popleft()  # far smaller than the batches it stands for: not seen in practice
                continue
            mid = link.publish(topic, data)
            if mid is None:
                return False
            queue.popleft()
            self.inflight[mid] = len(data)
            self.meter.sent(mid, len(data), now)
        return not queue

    def lost(self) -> None:
        """The connection dropped: summaries in flight are not sent again (the spool still has it all)."""
        self.inflight.clear()
        self.meter.lost()
