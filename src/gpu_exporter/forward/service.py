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
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.mqtt import Link, LinkSettings, payload_budget, publish_size
from gpu_exporter.forward.spool import Entry, Spool
from gpu_exporter.forward.spool_metrics import SpoolCollector
from gpu_exporter.forward.summary import EVENT_COUNTERS
from gpu_exporter.forward.twins import TwinWatch
from gpu_exporter.model import DeviceSample, Sample, SeriesKey
from gpu_exporter.payload import Batch, PayloadError, decode, encode, verify
from gpu_exporter.payload.split import split
from gpu_exporter.ring import RingBuffer

__all__ = ["EVENT_KEYS", "Forwarder", "has_event", "round_values"]

log = logging.getLogger("gpu_exporter.forward")

MAX_GROWTH = 16  # batch span multiplier reached during a long outage
WINDOW = 16  # batches in flight at once (paho's max_inflight is set to the same)
_HOUSEKEEPING = 1.0  # seconds between cap checks and gauge updates
_TURN = 0.1  # longest wait of one loop turn
_GRACE = 120.0  # seconds without a broker connection before forwarding counts as not working
ACK_TIMEOUT = 2.0  # keepalives without the PUBACK of a batch in flight before the broker counts as silent
_LOG_EVERY = 60.0


_COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")
# What an alert waits for: a change of one of these (or of a device's `up`, or a device coming or going)
# closes the open batch at once, so that a long --mqtt.batch-interval never delays it. (Summaries carry
# these counters in every window, whatever the link: forward/summary.py.)
EVENT_KEYS = EVENT_COUNTERS


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
        for kind in ("unreachable", "refused", "auth", "tls", "lost", "qos", "protocol", "timeout"):
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
        self.meter = LinkMeter(registry, config.mqtt_max_rate, settings.keepalive)
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
            self._cutting.clear()
            self._parts_out.clear()
            self.adaptive.lost()
            self.spool.pinned.clear()
            self._live.clear()
            self.metrics.connected.set(0)
            self.link = Link(settings, self.status_topic, self._acked, self._up, self._down)
            self.meter.keepalive = settings.keepalive
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
        self._check_acks(now)
        self.meter.tcp_rto = self.link.tcp_rto()
        self.link.pace_cap = self.meter.packet_cap()
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
        b, self._open = self._open, _OpenBatch(self._clock())
        entries = self._store(b.samples, b.journal)
        span = max(self._clock() - b.opened, b.samples[-1].timestamp - b.samples[0].timestamp)
        summarized = self.adaptive.closed(b.samples, entries, span, self.link.up)
        if not self.link.up:
            self._growth = min(MAX_GROWTH, self._growth * 2)
        elif not summarized:  # summarised: the raw batch waits in the backlog for room on the link
            self._live.extend(entries)

    def _hard_limit(self, pace: bool = False) -> int:
        """Largest payload that may ever be published: within the broker's Maximum Packet Size and, with
        ``pace``, within what the link carries at once (``Link.packet_limit``); 0 when neither is known."""
        packet = self.link.packet_limit() if pace else self.link.max_packet
        return payload_budget(self.topic, packet, self.link.v5) if packet else 0

    def _store(
        self, samples: list[Sample], journal: list[str], node: str = "", boot: str = "", hard: int = 0, part: str = ""
    ) -> list[Entry]:
        """Encode and spool, cut to fit; journal keys go with the last part of their sample.

        Samples are cut apart where a batch passes --mqtt.batch-max-bytes (a soft cap: a single sample over
        it goes as it is); a sample over ``hard`` (by default the broker's Maximum Packet Size) is cut by
        device and series (forward/split.py). Only a single series over it cannot go: it is dropped,
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

    # ------------------------------------------------------------------------------------- sending

    def _sendable(self) -> bool:
        busy = len(self._inflight) + len(self.adaptive.inflight)
        if not self.link.up or busy >= self.link.capacity() or self._clock() < self._hold_until:
            return False
        if not self.meter.allowed(self._clock()) or self.meter.inflight_bytes() >= self.meter.window():
            return False  # --mqtt.max-rate, or the link holds what it can carry within the keepalive
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
        if not self.adaptive.send(self.link, self.topic, self.link.capacity() - len(self._inflight), now):
            return  # summaries go before anything else
        if self.adaptive.active:  # when the next summary is due
            until_next = self.adaptive.next_due(time.time())
        else:
            until_next = self._open.opened + self._span() - now
        while self.link.up and len(self._inflight) + len(self.adaptive.inflight) < self.link.capacity():
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
        count = len(self._inflight) + len(self.adaptive.inflight)
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

    # ------------------------------------------------------------------------------------- callbacks

    def _acked(self, mid: int, ok: bool, reason: str) -> None:
        self.meter.acked(mid, self._clock(), self.link.status_rtt)
        self._stalled = ""  # the broker answers
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
        self._cutting.clear()
        self._parts_out.clear()
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
