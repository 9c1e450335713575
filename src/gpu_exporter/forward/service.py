"""The forwarder: follows the ring buffer, batches, spools, publishes, deletes on PUBACK.

Everything runs on one thread (paho's network loop included), so the spool and the in-flight table
need no lock. Per loop turn: take new samples from the ring (journaling each), close the open batch when
it is due, connect when a retry is due, publish while the in-flight window has room, read PUBACKs.

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
as room allows (``adaptive.Adaptive``; docs/forwarding.md, "Weak links").
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpu_exporter import catalog
from gpu_exporter.config import Config
from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.batch import Batch, PayloadError, decode, encode, verify
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.mqtt import Link, LinkSettings, payload_budget
from gpu_exporter.forward.spool import Entry, Spool
from gpu_exporter.forward.spool_metrics import SpoolCollector
from gpu_exporter.forward.twins import TwinWatch
from gpu_exporter.model import DeviceSample, Sample, SeriesKey
from gpu_exporter.ring import RingBuffer

__all__ = ["EVENT_KEYS", "Forwarder", "has_event", "round_values"]

log = logging.getLogger("gpu_exporter.forward")

MAX_GROWTH = 16  # batch span multiplier reached during a long outage
WINDOW = 16  # batches in flight at once (paho's max_inflight is set to the same)
_HOUSEKEEPING = 1.0  # seconds between cap checks and gauge updates
_TURN = 0.1  # longest wait of one loop turn
_GRACE = 120.0  # seconds without a broker connection before forwarding counts as not working
_LOG_EVERY = 60.0


_COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")
# What an alert waits for: a change of one of these (or of a device's `up`, or a device coming or going)
# closes the open batch at once, so that a long --mqtt.batch-interval never delays it.
EVENT_KEYS = frozenset(
    (
        "xid_errors",
        "ecc_uncorrected_volatile",
        "ecc_uncorrected_aggregate",
        "ecc_block_uncorrected",
        "remapped_rows_uncorrectable",
        "remapped_rows_failure",
    )
)


def has_event(before: Sample, after: Sample) -> bool:
    """Whether ``after`` tells something an alert waits for that ``before`` did not (see EVENT_KEYS)."""
    previous = {d.device: d for d in before.devices}
    if len(previous) != len(after.devices):
        return True
    for dev in after.devices:
        old = previous.get(dev.device)
        if old is None or old.up != dev.up:
            return True
        for series, value in dev.values.items():
            if series[0] in EVENT_KEYS and old.values.get(series) != value:
                return True
    return False


def round_values(
    sample: Sample,
    digits: int,
    keys: frozenset[str] | None = None,
    extra: Mapping[str, Mapping[SeriesKey, float]] | None = None,
) -> Sample:
    """Fractional gauge values to ``digits`` significant digits (0: unchanged); counters stay exact.

    NVML's GPM ratios and float artefacts such as 496.47200000000004 W carry 17 digits, of which no
    sensor means more than a few; rounded, they become decimals the codec stores as small integer deltas.
    A counter is never rounded: its resolution must not degrade as it grows. With ``keys`` (from
    ``--metrics.include``/``--metrics.exclude``) only those catalog keys are forwarded. ``extra`` adds
    values by device UUID (the per-pod series of pod attribution).
    """
    if not digits and keys is None and not extra:
        return sample
    devices = []
    for dev in sample.devices:
        values = {}
        added = extra.get(dev.device.uuid) if extra and dev.up else None
        readings = [*dev.values.items(), *added.items()] if added else dev.values.items()
        for series, v in readings:
            if keys is not None and series[0] not in keys:
                continue
            if digits and series[0] not in _COUNTERS and math.isfinite(v) and not float(v).is_integer():
                v = float(f"{v:.{digits}g}")
            values[series] = v
        devices.append(DeviceSample(dev.device, dev.up, values, dev.info, dev.processes))
    return Sample(sample.seq, sample.timestamp, tuple(devices), sample.duration)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        p = "gpu_exporter_forward_"
        r = registry
        self.connected = Gauge(p + "connected", "1 while connected to the MQTT broker.", registry=r)
        self.batches = Counter(p + "published_batches", "Batches acknowledged by the broker.", registry=r)
        self.samples = Counter(p + "published_samples", "Samples in acknowledged batches.", registry=r)
        self.bytes = Counter(p + "published_bytes", "Payload bytes of acknowledged batches.", registry=r)
        self.publish_errors = Counter(
            p + "publish_errors",
            "Batches the client or broker refused, or whose connection dropped before the PUBACK.",
            registry=r,
        )
        self.connect_errors = Counter(
            p + "connect_errors", "Failed or lost broker connections, by kind.", ["kind"], registry=r
        )
        self.spool_batches = Gauge(p + "spool_batches", "Batches waiting in the spool.", registry=r)
        self.spool_bytes = Gauge(p + "spool_bytes", "Payload bytes waiting in the spool.", registry=r)
        self.spool_oldest = Gauge(p + "spool_oldest_age_seconds", "Age of the oldest batch in the spool.", registry=r)
        self.spool_errors = Counter(
            p + "spool_write_errors",
            "Spool writes the disk refused (full, read-only, I/O error).",
            registry=r,
        )
        self.dropped_batches = Counter(
            p + "dropped_batches",
            "Batches dropped before the broker acknowledged them, by reason.",
            ["reason"],
            registry=r,
        )
        self.dropped_samples = Counter(
            p + "dropped_samples", "Samples in dropped batches, by reason.", ["reason"], registry=r
        )
        self.missed = Counter(
            p + "missed_samples",
            "Samples overwritten in the ring before the forwarder read them.",
            registry=r,
        )
        self.backlog = Gauge(
            p + "replay_backlog_batches",
            "Spooled batches waiting to be replayed after an outage.",
            registry=r,
        )
        self.internal_errors = Counter(
            p + "internal_errors",
            "Unexpected errors in the forwarder thread (each one retried after a backoff).",
            registry=r,
        )
        self.working = Gauge(
            p + "working",
            "1 while forwarding works; 0 when the forwarder fails, the broker refuses it, or it has been "
            "disconnected for over 2 minutes (samples wait in the spool meanwhile).",
            registry=r,
        )
        self.refused = Counter(
            p + "refused_publishes",
            "Batches the broker refused with an MQTT 5 reason code (resent after a backoff).",
            registry=r,
        )
        for reason in ("max_bytes", "max_age", "corrupt", "disk_full", "too_large"):
            self.dropped_batches.labels(reason)
            self.dropped_samples.labels(reason)
        for kind in ("unreachable", "refused", "auth", "tls", "lost", "qos", "protocol"):
            self.connect_errors.labels(kind)


class _OpenBatch:
    def __init__(self, now: float) -> None:
        self.samples: list[Sample] = []
        self.journal: list[str] = []
        self.opened = now
        self.device_samples = 0
        self.event = False  # holds a sample with news an alert waits for: close it now


_LINK_FIELDS = (
    "mqtt_url",
    "mqtt_username",
    "mqtt_password_file",
    "mqtt_tls_ca_file",
    "mqtt_tls_cert_file",
    "mqtt_tls_key_file",
    "mqtt_keepalive",
    "mqtt_reconnect_max_delay",
)


class Forwarder:
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
        self.metrics = _Metrics(registry)
        self.metrics.working.set(1)  # until a check says otherwise (see health)
        self._clock = clock
        self.spool = Spool(config.spool_dir, config.spool_max_bytes, config.spool_max_age, self._dropped)
        registry.register(SpoolCollector(self.spool))  # rows refused as not raw bytes, damaged WALs
        settings = LinkSettings.from_config(config, window=WINDOW)  # raises ConfigError for bad TLS files
        self.link = Link(settings, self.status_topic, self._acked, self._up, self._down)
        self.twins = TwinWatch(registry, self.node, settings.client_id, config.mqtt_reconnect_max_delay)
        self.meter = LinkMeter(registry, config.mqtt_max_rate)
        # summaries first where the link is too thin for full resolution (adaptive.py)
        self.adaptive = Adaptive(self.node, self.boot, self.meter, config.mqtt_batch_interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seq = 0
        self._previous: Sample | None = None  # the sample taken last, prepared
        self._event_closed = -math.inf  # when an event last closed a batch early
        self._open = _OpenBatch(clock())
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
        self.ready = threading.Event()  # set once the spool is open and recovered (for tests, tools)
        self._pending: Config | None = None  # a reloaded configuration, taken at the next turn

    # ------------------------------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="forwarder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Close the open batch into the spool, give in-flight batches a moment, say offline, disconnect."""
        self._stop.set()
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
        if any(getattr(old, f) != getattr(new, f) for f in _LINK_FIELDS):
            # first: TLS files changed since the reload's check raise here, and nothing has changed yet,
            # so the next reload tries the new broker settings again
            settings = LinkSettings.from_config(new, window=WINDOW)
        self.config = new
        self.meter.max_rate = new.mqtt_max_rate
        self.adaptive.interval = new.mqtt_batch_interval
        self._keys = catalog.kept_keys(new.metrics_include, new.metrics_exclude)
        if settings is not None:
            self.link.close(status=None)
            self._inflight.clear()  # still in the spool: they go again on the new connection
            self.adaptive.lost()
            self.spool.pinned.clear()
            self._live.clear()
            self.metrics.connected.set(0)
            self.link = Link(settings, self.status_topic, self._acked, self._up, self._down)
            log.info("forwarder: broker settings changed; connecting to %s", new.mqtt_url)

    def _turn(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            self._apply(pending)
        self._take()
        now = self._clock()
        if self._due(now):
            self._close_batch()
        if now - self._housekept >= _HOUSEKEEPING:
            self._housekeeping(now)
        self.link.step(timeout=0.0 if self._sendable() else _TURN)
        if self.link.up:
            self._send()
        if self.link.state == "down":
            wait = min(_TURN, self.link.wait_hint() or _TURN, self._until_due())
            self.ring.wait_after(self._last_seq, max(0.0, wait))

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
            while self.link.up and self._inflight and self._clock() < deadline:
                self.link.step(timeout=0.05)
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
                self._open = _OpenBatch(self._clock())
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
        b, self._open = self._open, _OpenBatch(self._clock())
        entries = self._store(b.samples, b.journal)
        span = max(self._clock() - b.opened, b.samples[-1].timestamp - b.samples[0].timestamp)
        summarized = self.adaptive.closed(b.samples, entries, span, self.link.up)
        if not self.link.up:
            self._growth = min(MAX_GROWTH, self._growth * 2)
        elif not summarized:  # summarised: the raw batch waits in the backlog for room on the link
            self._live.extend(entries)

    def _limit(self) -> int:
        """Largest payload to spool: --mqtt.batch-max-bytes, within the broker's Maximum Packet Size."""
        limit = self.config.mqtt_batch_max_bytes
        if self.link.max_packet:
            limit = min(limit, payload_budget(self.topic, self.link.max_packet, self.link.v5))
        return limit

    def _store(
        self, samples: list[Sample], journal: list[str], node: str = "", boot: str = "", limit: int = 0
    ) -> list[Entry]:
        """Encode (splitting what exceeds ``limit``, by default ``_limit()``) and spool; journal keys go with it.

        A single sample over the broker's Maximum Packet Size can never be sent: it is dropped, counted as
        ``too_large``. (Over --mqtt.batch-max-bytes alone, a soft cap, it is spooled and sent as it is.)
        """
        limit = limit or self._limit()
        data = encode(Batch(node or self.node, boot or self.boot, tuple(samples)))  # prepared in _take
        devices = sum(max(1, len(s.devices)) for s in samples)
        self._bytes_per_device_sample = 0.5 * self._bytes_per_device_sample + 0.5 * len(data) / devices
        if len(data) > limit and len(samples) > 1:
            half = len(samples) // 2
            cut = samples[half - 1].seq  # each half takes the journal keys of its own samples
            mine = {key for key in journal if int(key.rsplit(".", 1)[1]) <= cut}  # j.<boot>.<seq>
            first = self._store(samples[:half], sorted(mine), node, boot, limit)
            rest = [key for key in journal if key not in mine]
            return first + self._store(samples[half:], rest, node, boot, limit)
        if self.link.up and not self.link.fits(self.topic, len(data)):  # by the limit of this connection
            self._too_large(samples[0], len(data))
            self.spool.forget_journal(journal)
            return []
        before = self.spool.write_errors
        entry = self.spool.put(data, samples[0].seq, samples[-1].seq, len(samples), journal)
        if self.spool.write_errors != before:
            self.metrics.spool_errors.inc(self.spool.write_errors - before)
        return [entry] if entry in self.spool else []

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

    # ------------------------------------------------------------------------------------- sending

    def _sendable(self) -> bool:
        busy = len(self._inflight) + len(self.adaptive.inflight)
        if not self.link.up or busy >= self.link.capacity() or self._clock() < self._hold_until:
            return False
        if not self.meter.allowed(self._clock()):
            return False  # --mqtt.max-rate: nothing goes before the rate allows it
        if self.adaptive.queue:
            return True
        if self.adaptive.active:
            return False  # a raw batch goes on a weak link only as room allows: checked each turn
        return bool(self._live) or (len(self.spool) > len(self._inflight) and self._tokens >= 1)

    def _send(self) -> None:
        now = self._clock()
        rate = self.config.spool_replay_rate
        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        inflight = self.spool.pinned  # keys of the batches in flight (the spool's caps pass over them)
        live = {e.key for e in self._live}
        if now < self._hold_until:
            return  # the broker refused a batch: wait before trying again
        if not self.adaptive.send(self.link, self.topic, self.link.capacity() - len(self._inflight), now):
            return  # summaries go before anything else
        until_next = self._open.opened + self._span() - now  # when the next summary may be due
        while self.link.up and len(self._inflight) + len(self.adaptive.inflight) < self.link.capacity():
            if self._live and not self.adaptive.raw_allowed(self._live[0].size, now, until_next):
                break
            if self._live:
                entry = self._live.popleft()
                live.discard(entry.key)
                if entry not in self.spool or entry.key in inflight:
                    continue
            elif self._tokens >= 1:
                found = self._next_backlog(inflight | live)
                if found is None or not self.adaptive.raw_allowed(found.size, now, until_next):
                    break
                entry = found
                self._tokens -= 1
            else:
                break
            data = self.spool.get(entry)
            if data is None:
                continue
            try:
                verify(data)  # zlib checksum and length: what a damaged file or a torn write breaks
            except PayloadError as exc:
                self.spool.quarantine(entry, data, str(exc))
                continue
            if not self.link.fits(self.topic, len(data)):
                self._live.extendleft(reversed(self._resplit(entry, data)))  # the parts go next
                live = {e.key for e in self._live}
                continue
            mid = self.link.publish(self.topic, data)
            if mid is None:
                if self.link.refused_publish != "queue full":  # a full queue is retried, not an error
                    self.metrics.publish_errors.inc()
                break
            self._inflight[mid] = entry
            self.meter.sent(mid, len(data), now)
            inflight.add(entry.key)

    def _resplit(self, entry: Entry, data: bytes) -> list[Entry]:
        """A spooled batch over the broker's Maximum Packet Size: spool it again as parts that fit
        (written before the original goes, so that a crash in between repeats samples, never loses them)."""
        try:
            batch = decode(data)
        except PayloadError as exc:
            self.spool.quarantine(entry, data, str(exc))
            return []
        parts = self._store(list(batch.samples), [], batch.node, batch.boot)
        self.spool.remove(entry)
        log.info(
            "batch %d-%d (%d bytes) is over the broker's Maximum Packet Size (%d bytes): sent as %d part(s)",
            entry.first_seq,
            entry.last_seq,
            entry.size,
            self.link.max_packet,
            len(parts),
        )
        return parts

    def _too_large(self, sample: Sample, size: int) -> None:
        self._dropped("too_large", 1, 1)
        if not self._too_large_logged:
            self._too_large_logged = True
            need = self.link.max_packet - payload_budget(self.topic, self.link.max_packet, self.link.v5) + size
            log.error(
                "a sample of %d devices takes %d bytes as a PUBLISH of %d bytes, over the broker's Maximum "
                "Packet Size of %d bytes: dropped (gpu_exporter_forward_dropped_samples_total"
                '{reason="too_large"}); raise the broker\'s maximum packet size (Mosquitto: max_packet_size) '
                "to at least %d",
                len(sample.devices),
                size,
                need,
                self.link.max_packet,
                need,
            )

    def _next_backlog(self, exclude: set[str]) -> Entry | None:
        for entry in self.spool.entries_view():
            if entry.key not in exclude:
                return entry
        return None

    # ------------------------------------------------------------------------------------- callbacks

    def _acked(self, mid: int, ok: bool, reason: str) -> None:
        self.meter.acked(mid, self._clock(), self.link.status_rtt)
        if self.adaptive.inflight.pop(mid, None) is not None:
            return  # a summary: nothing in the spool to remove (a refused one is not sent again)
        entry = self._inflight.pop(mid, None)
        if entry is None:
            return  # the status message, or a batch of a connection already given up
        self.spool.pinned.discard(entry.key)
        if not ok:
            self.metrics.publish_errors.inc()
            self.metrics.refused.inc()
            # Not authorized, quota exceeded, topic invalid...: the same batch at once would be refused
            # again. Hold every publish for a while (doubling up to --mqtt.reconnect-max-delay).
            now = self._clock()
            if now >= self._hold_until:  # the rest of a refused window does not lengthen the wait again
                self._refusals += 1
                delay = min(self.config.mqtt_reconnect_max_delay, 1.0 * 2 ** min(self._refusals - 1, 10))
                self._hold_until = now + delay
            self._live.clear()  # the backlog order sends the refused batch first again
            if now - self._error_logged.get(reason, -math.inf) >= _LOG_EVERY:
                self._error_logged[reason] = now
                log.warning(
                    "broker refused batch %d-%d: %s; retrying in %.1fs (then with backoff, kept in the spool)",
                    entry.first_seq,
                    entry.last_seq,
                    reason,
                    self._hold_until - now,
                )
            return
        self._refusals = 0
        self.spool.remove(entry)
        self.metrics.batches.inc()
        self.metrics.samples.inc(entry.samples)
        self.metrics.bytes.inc(entry.size)

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
        self.adaptive.lost()
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
