"""The forwarder: follows the ring buffer, batches, spools, publishes, deletes on PUBACK.

Everything runs on one thread (paho's network loop included), so the spool and the in-flight table
need no lock. Per loop turn: take new samples from the ring (journaling each), close the open batch when
it is due, connect when a retry is due, publish while the in-flight window has room, read PUBACKs. A
turn waits up to 0.1 s on the socket; a quiet one (connected, nothing awaited or waiting to go) waits up
to 0.5 s on the ring instead, so that a new sample still starts the next turn at once but an idle
forwarder does not turn ten times a second.

Order after an outage: on reconnect the open batch is closed at once and sent first (dashboards are
current immediately); the backlog then drains oldest first at ``--spool.replay-rate`` batches per
second behind the fresh batches, which always go ahead of it. While the broker is unreachable each
closed batch doubles the next one's time span (up to 16x ``--mqtt.batch-interval``), so a long outage
leaves fewer, larger batches. While connected, a sample with news an alert waits for (a GPU lost or back,
an XID, an uncorrectable memory error: ``EVENT_KEYS``) closes its batch at once instead of at the end of
the interval.

The broker's MQTT 5 limits are obeyed (see ``Link``): a spooled batch whose PUBLISH would pass the
broker's Maximum Packet Size is split into batches that fit before it is sent, and a single sample that
cannot fit is dropped and counted (``too_large``); the in-flight window never passes Receive Maximum.
An unexpected error in a loop turn does not end the thread: it is logged (once a minute), counted, and
the turn is retried after a backoff, with a fresh connection; ``health`` says when forwarding is not
working (for /readyz).

On a link thinner than full resolution needs (measured from PUBACKs, or ``--mqtt.max-rate``), and for
a long backlog after an outage, summaries go before everything else and full-resolution batches only
as room allows (``adaptive.Adaptive``; docs/forwarding.md, "Weak links"). Each batch interval the
agent's own metrics go first of all, as a health report (``health.HealthReports``), even while no
sample comes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from gpu_exporter import catalog
from gpu_exporter.config import Config
from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.forward_metrics import ForwardMetrics
from gpu_exporter.forward.health import HealthReports
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.forward.prepare import OpenBatch, has_event, round_values
from gpu_exporter.forward.sender import Sender
from gpu_exporter.forward.spool import Spool
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.forward.spool_metrics import SpoolCollector
from gpu_exporter.forward.twins import TwinWatch
from gpu_exporter.model import Sample, SeriesKey
from gpu_exporter.mqtt.settings import LINK_FIELDS, LinkSettings
from gpu_exporter.payload import Batch, PayloadError, decode, encode
from gpu_exporter.payload.split import split
from gpu_exporter.ring import RingBuffer

__all__ = ["MAX_GROWTH", "WINDOW", "Forwarder"]

log = logging.getLogger("gpu_exporter.forward")

MAX_GROWTH = 16  # batch span multiplier reached during a long outage
WINDOW = 16  # batches in flight at once (paho's max_inflight is set to the same)
_HOUSEKEEPING = 1.0  # seconds between cap checks and gauge updates
_TURN = 0.1  # longest wait of one loop turn
# longest wait of a quiet turn (link up, nothing awaited or to send): it waits for the next sample, not on
# the socket, so an idle forwarder turns twice a second, not ten times (each turn took 0.3 ms of CPU)
_QUIET_TURN = 0.5
_GRACE = 120.0  # seconds without a broker connection before forwarding counts as not working
_LOG_EVERY = 60.0


class Forwarder(Sender):
    """Store-and-forward of the ring's samples to ``<prefix>/<node>/batch`` (see module doc)."""

    def __init__(
        self,
        config: Config,
        ring: RingBuffer,
        registry: CollectorRegistry,
        *,
        boot: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        extra: Callable[[], Mapping[str, Mapping[SeriesKey, float]]] | None = None,
    ) -> None:
        self.config = config
        self._extra = extra  # more values by device UUID: the newest per-pod series
        self._keys = catalog.kept_keys(config.metrics_include, config.metrics_exclude)
        self.ring = ring
        self.node = config.node_name
        self.boot = boot or uuid.uuid4().hex
        self.topic = f"{config.mqtt_topic_prefix}/{self.node}/batch"
        self.status_topic = f"{config.mqtt_topic_prefix}/{self.node}/status"
        self.metrics = ForwardMetrics(registry)
        self.metrics.working.set(1)  # until a check says otherwise (see health)
        self._clock = clock
        self.spool = Spool(config.spool_dir, config.spool_max_bytes, config.spool_max_age, self._dropped)
        registry.register(SpoolCollector(self.spool))  # rows refused as not raw bytes, damaged WALs
        settings = LinkSettings.from_config(config, window=WINDOW)  # raises ConfigError for bad TLS files
        self.link = Link(settings, self.status_topic, self._acked, self._up, self._down)
        self.twins = TwinWatch(registry, self.node, settings.client_id, config.mqtt_reconnect_max_delay)
        self.meter = LinkMeter(registry, config.mqtt_max_rate, settings.keepalive)
        # summaries first where the link is too thin for full resolution (adaptive.py)
        self.adaptive = Adaptive(self.node, self.boot, self.meter, config.mqtt_batch_interval, config.mqtt_value_digits)
        # the agent's own metrics, to the cloud every batch interval (health.py)
        self.reports = HealthReports(self.node, self.boot, registry, config.mqtt_value_digits)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seq = 0
        self._previous: Sample | None = None  # the sample taken last, prepared
        self._event_closed = -math.inf  # when an event last closed a batch early
        self._open = OpenBatch(clock())
        # when the time measured for the need of full resolution ends: the last batch's close, or the last
        # batch interval without samples (``_idle``)
        self._measured = clock()
        self._growth = 1
        self._bytes_per_device_sample = 64.0  # running estimate of the payload size
        self._inflight: dict[int, Entry] = {}
        self._live: deque[Entry] = deque()  # fresh batches, sent before the backlog
        self._tokens = 1.0
        self._tokens_at = clock()
        self._housekept = 0.0
        self._drop_logged: dict[str, float] = {}
        self._hold_until = -math.inf  # no publishing before this (the broker refused a batch)
        self._refusals = 0  # refusals in a row, for the backoff
        self._failures = 0  # unexpected errors in a row
        self._failed = ""  # the last unexpected error while it lasts, "" after a clean turn
        self._error_logged: dict[str, float] = {}
        self._down_since: float | None = clock()
        self._too_large_logged = False
        self._stalled = ""  # the broker stopped acknowledging what is in flight: why, until a PUBACK comes
        # A spooled batch larger than what the link carries at once, cut in memory (the cut depends on the
        # link of the moment; the batch stays in the spool, whole, until every part is acknowledged):
        self._cutting: dict[str, deque[bytes]] = {}  # spool key -> parts not yet published
        self._parts_out: dict[str, set[int]] = {}  # spool key -> message ids of parts awaiting their PUBACK
        self.ready = threading.Event()  # set once the spool is open and recovered (for tests, tools)
        self._pending: Config | None = None  # a reloaded configuration, taken at the next turn

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="forwarder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the open batch into the spool, give in-flight batches a moment, say offline, disconnect."""
        self._stop.set()
        self.ring.wake()  # a quiet turn waits on the ring
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            self._recover(self.spool.open())
        except Exception:  # never let the agent lose its exporter because of the spool
            log.exception("spool recovery failed; continuing with what could be read")
        self.ready.set()
        try:
            while not self._stop.is_set():
                try:
                    self._turn()
                except Exception as exc:  # contained: logged, counted, retried after a backoff
                    self._contain(exc)
                else:
                    if self._failed:
                        log.warning("forwarder works again after %d failed turn(s)", self._failures)
                    self._failures = 0
                    self._failed = ""
        finally:
            try:
                self._shutdown()
            except Exception:
                log.exception("forwarder shutdown failed; unsent samples stay journaled in the spool")

    def _contain(self, exc: Exception) -> None:
        """An unexpected error in a turn: one log line a minute per error, a count, a fresh connection,
        and a backoff (0.5 s doubling up to --mqtt.reconnect-max-delay) before the next turn."""
        self._failures += 1
        self._failed = f"{type(exc).__name__}: {exc}"
        self.metrics.internal_errors.inc()
        self.metrics.working.set(0)
        now = self._clock()
        if now - self._error_logged.get(self._failed, -math.inf) >= _LOG_EVERY:
            self._error_logged[self._failed] = now
            log.error(
                "forwarder error (retrying with backoff; samples are journaled meanwhile): %s",
                self._failed,
                exc_info=exc,
            )
        try:
            self.link.close()
        except Exception:
            self.link = Link(self.link.settings, self.status_topic, self._acked, self._up, self._down)
        self._down("")
        delay = min(self.config.mqtt_reconnect_max_delay, 0.5 * 2 ** min(self._failures - 1, 10))
        self._stop.wait(delay)

    def health(self, link: bool = True) -> tuple[bool, str]:
        """Whether forwarding works, and why not (``gpu_exporter_forward_working``). ``link=False`` leaves out
        an unreachable broker: a WAN outage is what the spool is for, so /readyz does not fail on it (a
        pod that is not ready leaves its Service, and local scrapes would stop when they matter most)."""
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            return False, "forwarder thread stopped"
        if self._failed:
            return False, f"forwarder failing: {self._failed}"
        if self._stalled:
            return False, self._stalled
        if self.link.error_kind == "qos":
            return False, f"forwarding refused: {self.link.error}"
        down = self._down_since
        if link and down is not None and self._clock() - down >= _GRACE:
            return False, f"not connected to the MQTT broker for {self._clock() - down:.0f}s: {self.link.error}"
        return True, "forwarding"

    def reconfigure(self, config: Config) -> None:
        """Take reloaded settings at the next turn (any thread); the open batch and the spool stay."""
        self._pending = config

    def _apply(self, new: Config) -> None:
        old = self.config
        settings = None
        if any(getattr(old, f) != getattr(new, f) for f in LINK_FIELDS):
            # first: TLS files changed since the reload's check raise here, and nothing has changed yet,
            # so the next reload tries the new broker settings again
            settings = LinkSettings.from_config(new, window=WINDOW)
        self.config = new
        self.meter.max_rate = new.mqtt_max_rate
        self.adaptive.interval = new.mqtt_batch_interval
        self.adaptive.digits = new.mqtt_value_digits
        self.reports.digits = new.mqtt_value_digits
        self._keys = catalog.kept_keys(new.metrics_include, new.metrics_exclude)
        if settings is not None:
            self.link.close(status=None)
            self._inflight.clear()  # still in the spool: they go again on the new connection
            self._cutting.clear()
            self._parts_out.clear()
            self.adaptive.lost()
            self.spool.pinned.clear()
            self._live.clear()
            self.metrics.connected.set(0)
            self.link = Link(settings, self.status_topic, self._acked, self._up, self._down)
            self.meter.keepalive = settings.keepalive
            self.twins.reconfigure(settings.max_delay)
            log.info("forwarder: broker settings changed; connecting to %s", new.mqtt_url)

    def _turn(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._apply(pending)
        self._take()
        now = self._clock()
        if self._due(now):
            self._close_batch()
        elif not self._open.samples and now - self._open.opened >= self._span():
            self._idle(now)
        if now - self._housekept >= _HOUSEKEEPING:
            self._housekeeping(now)
        self._check_acks(now)
        adaptive = self.adaptive
        if self.link.up and self.reports.due(now, self.config.mqtt_batch_interval, adaptive.active, adaptive.emitted):
            self.reports.make(now, adaptive.emitted)
        self.meter.tcp_rto = self.link.tcp_rto()
        self.link.pace_cap = self.meter.packet_cap()
        sendable = self._sendable()
        quiet = not sendable and self._quiet()
        self.link.step(timeout=0.0 if sendable or quiet else _TURN)
        if self.link.up:
            self._send()
        if self.link.state == "down":
            wait = min(_TURN, self.link.wait_hint() or _TURN, self._until_due())
            self.ring.wait_after(self._last_seq, max(0.0, wait))
        elif quiet:  # what the broker sends meanwhile (a PINGRESP) is read at the next turn
            # (until the open batch is due, or, empty, until a batch interval without samples has passed)
            due = self._open.opened + self._span()
            wait = min(_QUIET_TURN, due - now, self._housekept + _HOUSEKEEPING - now)
            self.ring.wait_after(self._last_seq, max(0.0, wait), self._stop)

    def _quiet(self) -> bool:
        """Up, and nothing awaited or waiting to go: no PUBACK due, no batch live, cut or in the backlog, no
        report, no summary. The turn then waits for the next sample rather than on the socket."""
        return (
            self.link.up
            and not self._inflight
            and not self._live
            and not self._cutting
            and not self._parts_out
            and len(self.spool) == 0
            and not self.adaptive.inflight
            and not self.adaptive.active
            and not self.adaptive.waiting()
            and not self.reports.inflight
            and self.reports.pending is None
        )

    def _shutdown(self) -> None:
        try:
            try:
                self._take()  # the samples taken since the last turn, the very last one included
            except Exception:
                log.exception("forwarder: could not take the last samples")
            if self._open.samples:
                self._close_batch()
            deadline = self._clock() + 2.0
            if self.link.up:
                self._send()  # the batch just closed, so that the last samples leave with us
            while self.link.up and (self._inflight or self._cutting) and self._clock() < deadline:
                self.link.step(timeout=0.05)
                if self._cutting and self.link.up:
                    self._send()  # the rest of a batch cut to what the link carries at once
            self.link.close(status=b"offline")
            self._housekeeping(self._clock())
        finally:
            self.spool.close()

    # ------------------------------------------------------------------------------------- batching

    def _take(self) -> None:
        samples, missed = self.ring.since(self._last_seq)
        if missed:
            self.metrics.missed.inc(missed)
            log.warning("forwarder fell behind the ring buffer: %d samples lost", missed)
        for sample in samples:
            if not self._open.samples:
                self._open = OpenBatch(self._clock())
            # Prepared once, when the sample is taken: filtered, rounded, and with the per-pod series of
            # that moment (the open batch holds the ring's own object when there is nothing to change).
            prepared = self._prepare(sample)
            data = encode(Batch(self.node, self.boot, (prepared,)), level=1)
            key = self.spool.journal(self.boot, sample.seq, data)
            if key is None:
                self.metrics.spool_errors.inc()
            else:
                self._open.journal.append(key)
            self._open.samples.append(prepared)
            self.adaptive.add(prepared)  # into the open summary window while the link is weak
            self._open.device_samples += max(1, len(sample.devices))
            if self._previous is not None and has_event(self._previous, prepared):
                self._open.event = True
            self._previous = prepared
            self._last_seq = sample.seq

    def _prepare(self, sample: Sample) -> Sample:
        extra = self._extra() if self._extra is not None else None
        return round_values(sample, self.config.mqtt_value_digits, self._keys, extra)

    def _span(self) -> float:
        return self.config.mqtt_batch_interval * self._growth

    def _due(self, now: float) -> bool:
        b = self._open
        if not b.samples:
            return False
        if len(b.samples) >= self.config.mqtt_batch_max_samples:
            return True
        if b.device_samples * self._bytes_per_device_sample >= 0.9 * self.config.mqtt_batch_max_bytes:
            return True
        if b.event and self.link.up and now - self._event_closed >= self.config.mqtt_batch_interval:
            self._event_closed = now  # at most one early close per interval: a flapping GPU costs little
            return True
        return now - b.opened >= self._span()

    def _until_due(self) -> float:
        if not self._open.samples:
            return _TURN
        return max(0.0, self._open.opened + self._span() - self._clock())

    def _close_batch(self) -> None:
        b, self._open = self._open, OpenBatch(self._clock())
        entries = self._store(b.samples, b.journal)
        now = self._clock()
        span = max(now - b.opened, b.samples[-1].timestamp - b.samples[0].timestamp)
        if now - b.opened < self._span():
            # Closed early (its sample count or size, an event, a reconnect), mostly in the turn its last
            # sample came: timed over what its samples cover, from where the previous batch ended (in the
            # turn of its own last sample) or the last batch interval without samples. Timed from its first
            # sample, a batch of one sample read as a burst hundreds of times the rate full resolution
            # takes, and a healthy link as a thin one. (The forwarder's clock, as the quiet intervals: a
            # wall clock stepped by NTP does not count as time covered.)
            span = max(span, now - self._measured)
        self._measured = now
        summarized = self.adaptive.closed(b.samples, entries, span, self.link.up)
        if not self.link.up:
            self._growth = min(MAX_GROWTH, self._growth * 2)
        elif not summarized:  # summarised: the raw batch waits in the backlog for room on the link
            self._live.extend(entries)

    def _idle(self, now: float) -> None:
        """A batch interval without a sample (sampling paused, a burst over): full resolution took nothing
        over it, and the link is judged again (``Adaptive.idle``), as when a batch closes. Without this, a
        judgement of weak made during a burst stood until the next sample, and no raw batch went."""
        span, self._open, self._measured = now - self._open.opened, OpenBatch(now), now
        self.adaptive.idle(span, self.link.up)

    def _store(
        self, samples: list[Sample], journal: list[str], node: str = "", boot: str = "", hard: int = 0, part: str = ""
    ) -> list[Entry]:
        """Encode and spool, cut to fit; journal keys go with the last part of their sample.

        Samples are cut apart where a batch passes --mqtt.batch-max-bytes (a soft cap: a single sample over
        it goes as it is); a sample over ``hard`` (by default the broker's Maximum Packet Size) is cut by
        device and series (payload/split.py). Only a single series over it cannot go: it is dropped,
        counted as ``too_large``.
        """
        hard = hard or self._hard_limit()
        batch = Batch(node or self.node, boot or self.boot, tuple(samples), part=part)  # prepared in _take
        pieces, _ = split(batch, self.config.mqtt_batch_max_bytes, hard=False)
        devices = sum(max(1, len(s.devices)) for s in samples)
        self._bytes_per_device_sample = (
            0.5 * self._bytes_per_device_sample + 0.5 * sum(len(d) for _, d in pieces) / devices
        )
        encoded = []
        for piece, data in pieces:
            if hard and len(data) > hard:
                parts, unfit = split(piece, hard)
                encoded += parts
                for sample, size in unfit:
                    self._too_large(sample, size, hard)
            else:
                encoded.append((piece, data))
        keys = {int(key.rsplit(".", 1)[1]): key for key in journal}  # j.<boot>.<seq>
        entries = []
        before = self.spool.write_errors
        for i, (piece, data) in enumerate(encoded):
            following = encoded[i + 1][0].first_seq if i + 1 < len(encoded) else None
            done = [s.seq for s in piece.samples if s.seq != following]  # a sample's last part takes its key
            mine = [keys.pop(seq) for seq in done if seq in keys]
            entries.append(self.spool.put(data, piece.first_seq, piece.last_seq, len(done), mine))
        if keys:
            self.spool.forget_journal(list(keys.values()))  # samples of which nothing could be kept
        if self.spool.write_errors != before:
            self.metrics.spool_errors.inc(self.spool.write_errors - before)
        return [entry for entry in entries if entry in self.spool]

    def _recover(self, journal: list[tuple[str, bytes]]) -> None:
        """Fold the samples journaled by a previous run (killed before it closed its batch) into batches."""
        groups: dict[tuple[str, str], list[tuple[Sample, str]]] = {}
        for key, data in journal:
            try:
                batch = decode(data)
            except PayloadError as exc:
                log.warning("spool journal entry %s is corrupt (%s); dropped", key, exc)
                self.spool.forget_journal([key])
                self._dropped("corrupt", 0, 1)
                continue
            for sample in batch.samples:
                groups.setdefault((batch.node, batch.boot), []).append((sample, key))
        for (node, boot), items in groups.items():
            items.sort(key=lambda item: item[0].seq)
            step = self.config.mqtt_batch_max_samples
            for i in range(0, len(items), step):
                chunk = items[i : i + step]
                self._store([s for s, _ in chunk], [k for _, k in chunk], node, boot)
            log.info("recovered %d journaled samples of boot %s from the spool", len(items), boot)

    def _up(self) -> None:
        self.metrics.connected.set(1)
        self._down_since = None
        self._growth = 1
        self._live.clear()
        if self._open.samples:
            self._close_batch()  # the newest data goes first
        else:
            newest = self.spool.newest()
            if newest is not None:
                self._live.append(newest)
        self._tokens = 1.0
        self._tokens_at = self._clock()
        self.adaptive.backlog(self.spool.entries_view(), self.spool.get)  # a long backlog: summaries first
        self.reports.make(self._clock(), self.adaptive.emitted)  # the agent's state at once, ahead of all

    def _down(self, message: str) -> None:
        self.metrics.connected.set(0)
        loss, self.link.last_loss = self.link.last_loss, None
        self.twins.down(loss)  # another agent with this client id? (twins.py)
        if self._down_since is None:
            self._down_since = self._clock()
        if message:
            self.metrics.connect_errors.labels(self.link.error_kind or "lost").inc()
        if self._inflight:
            self.metrics.publish_errors.inc(len(self._inflight))
        self._inflight.clear()
        self._cutting.clear()
        self._parts_out.clear()
        self.adaptive.lost()
        self.reports.lost()
        self.spool.pinned.clear()
        self._live.clear()

    def _dropped(self, reason: str, batches: int, samples: int) -> None:
        if batches:
            self.metrics.dropped_batches.labels(reason).inc(batches)
        if samples:
            self.metrics.dropped_samples.labels(reason).inc(samples)
        if reason in ("max_bytes", "max_age", "disk_full"):
            now = self._clock()
            if now - self._drop_logged.get(reason, -1e9) >= 60:  # one line a minute per reason, not per batch
                self._drop_logged[reason] = now
                log.warning(
                    "spool: dropping the oldest batches (%s); see gpu_exporter_forward_dropped_batches_total",
                    reason,
                )

    def _housekeeping(self, now: float) -> None:
        self._housekept = now
        self.spool.expire()
        m = self.metrics
        m.spool_batches.set(len(self.spool))
        m.spool_bytes.set(self.spool.total_bytes)
        m.spool_oldest.set(self.spool.oldest_age())
        m.backlog.set(max(0, len(self.spool) - len(self._live) - len(self._inflight)))
        m.connected.set(1 if self.link.up else 0)
        m.working.set(1 if self.health()[0] else 0)
        if not self.spool.on_disk:
            journal = self.spool.retry_open()  # a spool directory that became usable after the start
            if journal is not None:
                log.warning("spool in %s is usable now; batches held in memory are written to it", self.spool.directory)
                self._recover(journal)
