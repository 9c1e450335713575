"""Adaptive forwarding: summaries first while full resolution does not fit the link.

The forwarder tells this module of every sample it takes (``add``) and of every full-resolution batch it
closes (``closed``), and asks it what to publish (docs/forwarding.md, "Weak links"):

- ``closed``: a batch was closed and spooled. While the link is weak (``LinkMeter.weak``) the batch waits
  in the spool's backlog instead of going ahead as a fresh batch, and the samples go into a summary
  window instead (the first weak batch's samples start it).
- ``idle``: a batch interval passed without a sample (sampling paused, a burst over). It counts as a batch
  that took nothing, and the link is judged again as at a batch's close: summarising ends once full
  resolution fits, without waiting for another sample.
- ``add``: while weak, each sample joins the open window, which closes as soon as it spans a batch
  interval, the link has taken the previous summary (its last part acknowledged: ``acked`` closes a
  window due by then, the link is not left idle until the next sample) and the pacing window has room
  for it (a raw batch still on the link: the summary would only wait). On
  a link that takes T seconds for a summary, windows are max(interval, T) long and the cloud's lag about
  that plus T: the least the link allows, and no estimate of the link's rate decides it. The summary is
  kept small where that buys freshness: on a link too thin to bring a whole summary within two batch
  intervals, each device's counters (exact at any two points: energy, NVLink and PCIe bytes...) travel
  every ``every``-th window only, devices in turn, while gauges and the counters an alert waits for go
  in every window. ``every`` is the least that brings the lag near what dropping counters altogether
  would, from what summaries measured of the link end to end.
- ``send``: the fresh summary first, cut to what the link carries at once (payload/split.py), then the
  summaries of a backlog.
- ``backlog``: on reconnect, when the spool holds more than two batch intervals' worth of what the link
  has to spare beside fresh full resolution (at the least it carried lately: one lucky reading must not
  send a long backlog raw), each spooled batch (up to ``MAX_BACKLOG``, oldest first) becomes one summary
  point, and neighbouring points merge into wider windows until all of them take the link at most
  ``COARSE_SECONDS``: an outage is visible coarse before its full resolution has drained.
- ``raw_allowed``: whether a full-resolution batch may be published now. With ``--mqtt.max-rate`` only
  what the rate allows; while weak, only if its PUBACK is due before the next summary.

Summaries live in memory only (the raw batches they summarise stay in the spool); what the broker did
not acknowledge when the connection dropped is summarised again from the spool on reconnect.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from gpu_exporter.forward.link_meter import LEAVE, LinkMeter
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.forward.summary import Window, encode_summary, merge, summarize
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.mqtt.packet import payload_budget
from gpu_exporter.payload import Batch, PayloadError, decode, encode
from gpu_exporter.payload.split import split

__all__ = ["COARSE_SECONDS", "EVERY", "MAX_BACKLOG", "Adaptive"]

log = logging.getLogger("gpu_exporter.forward")

EVERY = (1, 2, 4, 8, 16)  # counters every this many windows
MAX_BACKLOG = 4096  # spooled batches summarised on reconnect
_POINTS = 64  # summary points per backlog summary batch
COARSE_SECONDS = 30.0  # the summaries of a backlog take the link this long at most (windows widen to fit)
_FRAMING = 80  # bytes a PUBLISH adds to a summary's payload (topic, packet id, properties)
_PART = 300  # bytes each further part of a summary cut to fit the link costs (its header, metric list)


def _join(a: Sample, b: Sample) -> Sample:
    """One summary point of two that hold different devices (or series) of the same sample: the parts of
    a sample cut to fit the link (payload/split.py), summarised each on its own."""
    devices = {d.device: d for d in a.devices}
    for dev in b.devices:
        mine = devices.get(dev.device)
        values = {**mine.values, **dev.values} if mine is not None else dev.values
        devices[dev.device] = DeviceSample(dev.device, dev.up, values)
    return Sample(a.seq, a.timestamp, tuple(devices.values()))


class Adaptive:
    def __init__(self, node: str, boot: str, meter: LinkMeter, interval: float, digits: int = 0) -> None:
        self.node = node
        self.interval = interval  # --mqtt.batch-interval
        self.digits = digits  # --mqtt.value-digits: a moving gauge's figures in a summary (summary.py)
        self.boot = boot
        self.meter = meter
        self.window_s = interval  # what the last fresh summary spanned
        self.every = 1  # each device's counters go in every this many windows (EVERY)
        self.queue: deque[bytes] = deque()  # backlog summary payloads, after the fresh summary
        self._fresh: deque[bytes] = deque()  # the fresh summary on its way, in parts
        self._pending: tuple[Sample, float, int] | None = None  # a fresh summary not yet sent: point, span, size
        self.inflight: dict[int, int] = {}  # summaries published: mid -> bytes
        self._window: Window | None = None
        # timestamp the open window starts at (the previous window's last sample); None: no window since the
        # last full-resolution stretch, the next one starts at the sample before its first (``_last``)
        self._start: float | None = None
        self._last: float | None = None  # timestamp of the last sample taken
        self._windows = 0  # windows closed while weak (the counter rotation)
        self.emitted = 0  # fresh summaries made (for tests and the log)
        self.active = False  # summarising: full resolution does not fit
        self.rate = 0.0  # bytes per second fresh summaries travel at, end to end (0: not measured yet)
        self._delivery: list[Any] | None = None  # the fresh summary on its way: [start, bytes, mids, idle]
        self._last_size = 0  # bytes of the last fresh summary (what the next one needs room for)
        # spool key -> summary of that batch made when it was closed (None: summarised already)
        self._made: OrderedDict[str, bytes | None] = OrderedDict()

    # ------------------------------------------------------------------------------------ windows

    def closed(self, samples: list[Sample], entries: list[Entry], span: float, connected: bool) -> bool:
        """A full-resolution batch was spooled as ``entries``; True when it should wait in the backlog
        (summarised). While disconnected its summary is made now, from the samples at hand, and kept
        (encoded, a few kB) for the reconnect: cheaper than reading the batch back from the spool."""
        self.meter.produced(sum(e.size for e in entries), span)
        if not connected and entries:
            self._remember(
                entries, encode_summary(self.node, self.boot, [summarize(samples, digits=self.digits)], span)
            )
        # While summarising, full resolution must fit with room to spare to end it: one optimistic figure
        # (a lone packet after an idle moment rides the link's burst) must not flip a link that cannot
        # carry full resolution back to it.
        weak = connected and (self.meter.weak(headroom=LEAVE) if self.active else self.meter.weak())
        if weak and entries:
            self._remember(entries, None)  # summarised live: not again after an outage
        if not weak:
            self._end()
            return False
        if not self.active:  # the first weak batch starts the window; later samples come through ``add``
            self._flag(True)
            self._window = Window(digits=self.digits)
            self._start = samples[0].timestamp - span / max(1, len(samples))
            for sample in samples:
                self._window.add(sample)
            self._size(self._window)
            self._due()
        return True

    def idle(self, span: float, connected: bool) -> None:
        """A batch interval of ``span`` seconds without a sample: full resolution took nothing over it (the
        link meter's ``need`` falls), and the link is judged again as when a batch closes. A burst that
        turned summarising on, or a link that recovered, must not hold raw batches back until the next
        sample: a weak judgement ends once the need over the latest batch intervals fits."""
        self.meter.produced(0, span)
        if self.active and not (connected and self.meter.weak(headroom=LEAVE)):
            self._end()

    def _end(self) -> None:
        """Full resolution fits (or the broker is away): no summarising, no open window."""
        self._flag(False)
        self._window, self._start = None, None
        self.every = 1

    def add(self, sample: Sample) -> None:
        """A sample taken by the forwarder: into the open window while weak."""
        last, self._last = self._last, sample.timestamp
        if not self.active:
            return
        if self._window is None:
            self._window = Window(digits=self.digits)
            if self._start is None:  # summarising began without a window (a backlog on reconnect)
                self._start = last if last is not None and last < sample.timestamp else sample.timestamp
        self._window.add(sample)
        self._due()

    def _due(self) -> None:
        """Close the open window when it spans a batch interval and the link has taken the previous
        summary: on a link that carries a summary in T seconds, windows of max(interval, T) and a lag of
        about that plus T, the least the link allows, whatever anyone estimated of its rate."""
        window = self._window
        if window is None or window.last is None or self._start is None:
            return
        span = window.last.timestamp - self._start
        if span < self.interval or self._pending is not None or self._fresh or self._delivery is not None:
            return
        if not self.meter.room(self._last_size + _FRAMING):
            return  # a raw batch is still on the link: the window takes the samples until it can go
        self._windows += 1
        k, turn = self.every, self._windows

        def counters_of(position: int, device: DeviceId) -> bool:
            return k == 1 or position % k == turn % k

        point = window.point(counters_of)
        size = self._size(window)
        self._window, self._start = None, window.last.timestamp
        self.emitted += 1
        self.window_s = span
        self._show()
        self._pending = (point, span, size)
        self._last_size = size
        log.debug("summary of %.1fs (%d bytes, counters of every %d) at %.0f B/s", span, size, k, self._rate())

    def _size(self, window: Window) -> int:
        """Measure a summary of ``window`` with and without counters, and choose the counters' turn from it
        (the least that brings the lag near what leaving counters out altogether would); the size of what
        this window sends."""
        full = len(encode_summary(self.node, self.boot, [window.point()], self.interval))
        gauges = len(encode_summary(self.node, self.boot, [window.point(lambda p, d: False)], self.interval))
        budget = self._rate()
        if not self.rate:  # not measured end to end yet: the leanest summary until the link is known
            self.every = EVERY[-1]
        elif budget:
            lags = [self._lag(gauges + (full - gauges) / k, budget) for k in EVERY]
            for k, lag in zip(EVERY, lags, strict=True):
                if lag <= max(2 * self.interval, lags[-1] + 0.2 * self.interval):
                    if k != self.every:
                        log.info(
                            "link carries %.0f B/s: each device's counters in every %s",
                            budget,
                            "window" if k == 1 else f"{k}th window",
                        )
                    self.every = k
                    break
        return round(gauges + (full - gauges) / self.every)

    def _rate(self) -> float:
        """What fresh summaries get through at: as measured on them, from the first part's publish on an
        idle link to the last part's PUBACK (headers, acknowledgements and the round trip included, which
        the link meter's figure for a lone packet leaves out), else the link meter's; within
        --mqtt.max-rate."""
        rate = self.rate or self.meter.budget()
        return min(rate, self.meter.max_rate) if self.meter.max_rate and rate else rate

    def _lag(self, payload: float, budget: float) -> float:
        """The cloud's lag with fresh summaries of ``payload`` bytes on a link of ``budget`` bytes/s: one
        window (a batch interval, or the time the link takes a summary when longer) plus that time, parts
        included when the pacing window cuts it."""
        size = payload + _FRAMING
        cap = self.meter.window()
        if size > cap:
            size += _PART * (math.ceil(size / cap) - 1)
        return max(self.interval, size / budget) + size / budget

    def _remember(self, entries: list[Entry], data: bytes | None) -> None:
        self._made[entries[0].key] = data
        for entry in entries[1:]:
            self._made[entry.key] = None  # covered by the first part's summary
        while len(self._made) > MAX_BACKLOG:
            self._made.popitem(last=False)

    def _flag(self, weak: bool) -> None:
        self.active = weak
        gauge = self.meter.summarizing
        if gauge is not None:
            gauge.set(1 if weak else 0)
        self._show()

    def _show(self) -> None:
        gauge = self.meter.summary_window
        if gauge is not None:
            gauge.set(self.window_s if self.active else 0)

    def next_due(self, now: float) -> float:
        """Seconds until the open window closes (wall clock ``now``); a long time when not summarising. A
        window past its end closes with the next sample (or as soon as the link has taken the previous
        summary): nothing may go ahead of it, 0. When no sample came for a batch interval (sampling
        paused), nothing fresh is held back, and a batch interval is the wait assumed."""
        if not self.active:
            return math.inf
        if self._start is None:  # summarising a backlog, no fresh window yet: the next sample starts one
            return self.interval
        due = self._start + self.interval - now
        if due > 0:
            return due
        window = self._window
        last = window.last.timestamp if window is not None and window.last is not None else self._start
        return 0.0 if now - last < self.interval else self.interval

    # ------------------------------------------------------------------------------------ backlog

    def backlog(self, entries: Iterable[Entry], read: Callable[[Entry], bytes | None]) -> int:
        """On reconnect: summary points of the spooled backlog when it will take long to drain; how many.

        Long: more than two batch intervals at what the link has to spare beside fresh full resolution,
        at the least the link carried lately (``LinkMeter.floor``), so that one lucky reading never sends
        a long backlog raw."""
        budget = self.meter.floor()
        listed = list(entries)
        total = sum(e.size for e in listed)
        spare = budget - self.meter.need
        if not budget or (spare > 0 and total <= 2 * self.interval * spare):
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
                point = summarize(batch.samples, digits=self.digits)
                span = batch.samples[-1].timestamp - batch.samples[0].timestamp
            groups.setdefault((batch.node, batch.boot), []).append((point, max(span, self.interval)))
        made = 0
        for (node, boot), points in groups.items():
            points.sort(key=lambda p: p[0].seq)
            joined: list[tuple[Sample, float]] = []
            for point, span in points:
                if joined and joined[-1][0].seq == point.seq:  # another part of the same sample
                    joined[-1] = (_join(joined[-1][0], point), joined[-1][1])
                else:
                    joined.append((point, span))
            points = joined
            points = self._coarsen(node, boot, points, budget)
            for i in range(0, len(points), _POINTS):
                chunk = points[i : i + _POINTS]
                window = sum(span for _, span in chunk) / len(chunk)
                self.queue.append(encode_summary(node, boot, [p for p, _ in chunk], window))
                made += len(chunk)
        if made:
            self._flag(True)
            log.info(
                "link carries %.0f B/s at least, full resolution needs %.0f: %d spooled batches (%d bytes) go "
                "first as summaries",
                budget,
                self.meter.need,
                made,
                total,
            )
        return made

    def _coarsen(
        self, node: str, boot: str, points: list[tuple[Sample, float]], budget: float
    ) -> list[tuple[Sample, float]]:
        """Fewer, wider points when the summaries of the backlog would take the link over COARSE_SECONDS."""
        limit = budget * COARSE_SECONDS
        merged, k = points, 1
        for _ in range(8):  # a merged point holds more statistics than the ones it stands for: measure again
            probe = [p for p, _ in merged[:_POINTS]]  # one batch of points, as it will be sent
            size = len(encode_summary(node, boot, probe, self.interval)) * len(merged) / len(probe)
            if size <= limit or len(merged) == 1:
                break
            k = max(k + 1, math.ceil(k * size / limit))
            merged = [merge(points[i : i + k], self.digits) for i in range(0, len(points), k)]
        return merged

    # ------------------------------------------------------------------------------------ sending

    def raw_allowed(self, size: int, now: float, until_next: float) -> bool:
        """Whether a full-resolution batch of ``size`` bytes may be published now, the next summary being
        due in ``until_next`` seconds: within --mqtt.max-rate, and while weak only if its PUBACK is due
        before the next summary (what is in flight included), so that full resolution never holds fresh
        data back."""
        if not self.meter.allowed(now):
            return False
        if not self.active:
            return True
        rate = self._rate()  # what summaries get through at, end to end: a lone packet's figure is kinder
        return bool(rate) and (self.meter.inflight_bytes() + size) / rate <= 0.8 * until_next

    def waiting(self) -> bool:
        """Whether a summary waits to be published."""
        return bool(self._fresh or self._pending is not None or self.queue)

    def fresh_waiting(self) -> bool:
        """Whether a fresh summary (or a part of it) waits to be published: it goes before anything else."""
        return bool(self._fresh or self._pending is not None)

    def can_send(self, link: Link, topic: str) -> bool:
        """Whether the next summary may go now (the pacing window has room for it): the forwarder polls
        the network without waiting only then."""
        if self._fresh or (self._pending is None and self.queue):
            data = (self._fresh or self.queue)[0]
            return not link.fits(topic, len(data)) or self.meter.room(link.packet_size(topic, len(data)))
        return self._pending is not None and self.meter.room(self._pending[2] + _FRAMING)

    def send(
        self, link: Link, topic: str, room: int, now: float, lead: Callable[[], bytes | None] | None = None
    ) -> bool:
        """Publish summaries while ``room`` (in-flight slots less what is in flight), the pacing window and
        the rate allow: the fresh one first, then the backlog's; False while some still wait. ``lead``
        gives a payload to go in a fresh summary's delivery, right behind it (the agent's health report,
        health.py), which is then measured over both."""
        while link.up and len(self.inflight) < room:
            if not self._fresh and self._pending is not None:
                point, span, size = self._pending
                if not self.meter.room(size + _FRAMING):
                    return False  # it waits for room in the pacing window
                self._pending = None
                self._fresh.extend(
                    self._cut(Batch(self.node, self.boot, (point,), max(1, round(span * 1000))), link, topic)
                )
                report = lead() if lead is not None else None
                if report is not None and link.fits(topic, len(report)):
                    self._fresh.append(report)  # right behind the summary: it does not delay the summary
                self._delivery = [now, 0, set(), not self.meter.inflight_bytes()]
                continue
            source = self._fresh or self.queue
            if not source:
                return True
            data = source[0]
            if not link.fits(topic, len(data)):  # cut to what the link (or broker) takes now
                source.popleft()
                try:
                    source.extendleft(reversed(self._cut(decode(data), link, topic)))
                except PayloadError:
                    pass
                continue
            packet = link.packet_size(topic, len(data))
            if not self.meter.allowed(now) or not self.meter.room(packet):
                return False
            mid = link.publish(topic, data)
            if mid is None:
                return False
            fresh = source is self._fresh
            source.popleft()
            self.inflight[mid] = len(data)
            self.meter.sent(mid, packet, now)
            if fresh and self._delivery is not None:
                self._delivery[1] += packet
                self._delivery[2].add(mid)
        return not self.waiting()

    def acked(self, mid: int, now: float) -> bool:
        """A PUBACK; True when it was a summary's. The last part of a fresh summary sent on an idle link
        measures what fresh summaries travel at (``rate``)."""
        if self.inflight.pop(mid, None) is None:
            return False
        delivery = self._delivery
        if delivery is not None and mid in delivery[2]:
            delivery[2].discard(mid)
            if not delivery[2] and not self._fresh:
                self._delivery = None
                took = now - delivery[0]
                if delivery[3] and took > 0:
                    sample = delivery[1] / took
                    self.rate = sample if not self.rate else 0.3 * self.rate + 0.7 * sample
                # the link is free: the open window closes now if it spans a batch interval, not at the
                # next sample (up to a sampling interval later, for which the link would stand idle)
                self._due()
        return True

    def _cut(self, batch: Batch, link: Link, topic: str) -> list[bytes]:
        limit = payload_budget(topic, link.packet_limit(), link.v5) if link.packet_limit() else 1 << 30
        parts, unfit = split(batch, limit, encoder=encode)
        if unfit:
            log.debug("%d summary values over the packet limit of %d bytes: left out", len(unfit), limit)
        return [data for _, data in parts]

    def lost(self) -> None:
        """The connection dropped: summaries in flight are not sent again (the spool still has it all)."""
        self.inflight.clear()
        self._delivery = None
        self.meter.lost()
