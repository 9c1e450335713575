"""Health reports: the agent's own state, sent to the cloud beside its samples.

Every ``--mqtt.batch-interval`` the forwarder reads the agent's own metrics from its registry (the names
``REPORTED``, exactly as the /metrics page serves them) and publishes them as a health report on the
node's batch topic (payload/health.py; docs/forwarding.md, "The agent's health in the cloud"). The bridge
writes them with the ``node`` label under the same names, so one dashboard panel and one alert serve a
scraped node and a bridged one alike.

A report is the state of one moment, so it is not spooled: while the broker is away none is made, on
reconnect one goes at once, and a report the link has not taken yet is replaced by the next one. It goes
ahead of everything else on the link, within the pacing window and ``--mqtt.max-rate``; behind a fresh
summary only (in its delivery, adaptive.py). It is made per batch interval on the forwarder's own clock, so a sampler that hangs
(a driver call that never returns) still reports, and its last successful collect ages in the cloud as on
the node. While summaries go first (a thin link), a report goes with a fresh summary, every
``WEAK_EVERY`` seconds at most: on a link of 150 B/s each report costs about two and a half seconds of it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.mqtt import Link
from gpu_exporter.model import Sample
from gpu_exporter.payload import Batch, HealthValue, encode

__all__ = ["REPORTED", "WEAK_EVERY", "HealthReports", "snapshot"]

log = logging.getLogger("gpu_exporter.forward")

# Seconds between reports at least while summaries go first: on a thin link every byte delays the GPUs'
# data (at 150 B/s a report every 30 s took the newest sample's worst age from 42 to 56 s), and the alerts
# on the agent's state wait minutes (GPUExporterStale: 2, the spool's: 15): a report a minute, some 40 s
# late, still shows a stalled agent within GPUExporterStale's 2 minutes.
WEAK_EVERY = 60.0

# What a report carries: the figures a fleet operator runs a node by (collect, spool, drops, link,
# takeovers, build, process), by their names on the agent's page.
REPORTED = frozenset(
    (
        "gpu_exporter_build_info",
        "gpu_exporter_collect_duration_seconds",
        "gpu_exporter_collect_seconds_total",
        "gpu_exporter_collects_total",
        "gpu_exporter_collect_overruns_total",
        "gpu_exporter_collect_errors_total",
        "gpu_exporter_last_collect_success_timestamp_seconds",
        "gpu_exporter_backend_healthy",
        "gpu_exporter_sampler_stale",
        "gpu_exporter_host_read_failures_total",
        "gpu_exporter_host_reads_stuck",
        "gpu_exporter_ring_overwritten_total",
        "gpu_exporter_values_dropped_total",
        "gpu_exporter_counter_resets_total",
        "gpu_exporter_forward_connected",
        "gpu_exporter_forward_working",
        "gpu_exporter_forward_spool_batches",
        "gpu_exporter_forward_spool_bytes",
        "gpu_exporter_forward_spool_oldest_age_seconds",
        "gpu_exporter_forward_spool_write_errors_total",
        "gpu_exporter_forward_replay_backlog_batches",
        "gpu_exporter_forward_dropped_batches_total",
        "gpu_exporter_forward_missed_samples_total",
        "gpu_exporter_forward_publish_errors_total",
        "gpu_exporter_forward_internal_errors_total",
        "gpu_exporter_forward_link_bytes_per_second",
        "gpu_exporter_forward_full_resolution_bytes_per_second",
        "gpu_exporter_forward_summarizing",
        "gpu_exporter_forward_summaries_window_seconds",
        "gpu_exporter_forward_session_takeovers_total",
        "gpu_exporter_forward_twin_suspected",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    )
)


def _rounded(name: str, value: float, digits: int) -> float:
    """Timestamps and counters to the millisecond (a counter stays monotonic, its rate exact enough);
    other fractional values to ``digits`` significant digits, as the forwarder rounds GPU gauges
    (--mqtt.value-digits; 0 keeps every value exact)."""
    if not digits or value.is_integer():
        return value
    if name.endswith(("_total", "_timestamp_seconds", "_time_seconds")):
        return round(value, 3)
    return float(f"{value:.{digits}g}")


def snapshot(registry: CollectorRegistry, digits: int = 4) -> tuple[HealthValue, ...]:
    """The ``REPORTED`` values of ``registry`` now, as its page would show them."""
    out: list[HealthValue] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for family in registry.collect():
        for s in family.samples:
            if s.name not in REPORTED or not math.isfinite(s.value):
                continue
            labels = tuple(sorted(s.labels.items()))
            if (s.name, labels) in seen:
                continue
            seen.add((s.name, labels))
            out.append(HealthValue(s.name, labels, _rounded(s.name, float(s.value), digits)))
    return tuple(out)


class HealthReports:
    """Makes, holds and publishes the node's health reports (one thread: the forwarder's)."""

    def __init__(
        self,
        node: str,
        boot: str,
        registry: CollectorRegistry,
        digits: int = 4,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.boot = boot
        self.registry = registry
        self.digits = digits
        self._wall = wall
        self.seq = 0  # reports made this boot (each report's own sequence number)
        self.pending: bytes | None = None  # the newest report, not yet published
        self.inflight: dict[int, int] = {}  # published, awaiting the PUBACK: mid -> bytes
        self.made_at = -math.inf  # forwarder clock of the last report made
        self.summaries = 0  # fresh summaries made when the last report was (Adaptive.emitted)
        self.sent = 0  # reports acknowledged, or handed to a fresh summary (for tests and the bench)
        self._unfit_logged = False

    def due(self, now: float, interval: float, summarising: bool, summaries: int) -> bool:
        """A batch interval since the last report; while summaries go first, ``WEAK_EVERY`` seconds at
        least, and a fresh summary since (the report goes with it)."""
        if now - self.made_at < (max(interval, WEAK_EVERY) if summarising else interval):
            return False
        return not summarising or summaries != self.summaries

    def make(self, now: float, summaries: int = 0) -> None:
        values = snapshot(self.registry, self.digits)
        self.made_at, self.summaries = now, summaries
        if not values:
            return
        self.seq += 1
        sample = Sample(self.seq, round(self._wall(), 3), ())
        self.pending = encode(Batch(self.node, self.boot, (sample,), health=values))

    def send(self, link: Link, topic: str, meter: LinkMeter, now: float, room: int) -> bool:
        """Publish the pending report when the link, the in-flight window (``room`` more publishes), the
        pacing window and the rate allow; False while it waits (nothing else goes before it)."""
        data = self.pending
        if data is None or not link.up:
            return True
        if room <= 0:
            return False
        if not link.fits(topic, len(data)):  # over what the broker or the link takes in one packet
            self.pending = None
            if not self._unfit_logged:
                self._unfit_logged = True
                log.warning("health report of %d bytes is over what the link carries at once: not sent", len(data))
            return True
        packet = link.packet_size(topic, len(data))
        if not meter.allowed(now) or not meter.room(packet):
            return False
        mid = link.publish(topic, data)
        if mid is None:
            return False
        self.pending = None
        self.inflight[mid] = len(data)
        meter.sent(mid, packet, now)
        return True

    def take(self) -> bytes | None:
        """The pending report, handed over to go with a fresh summary (adaptive.py acknowledges it)."""
        data, self.pending = self.pending, None
        if data is not None:
            self.sent += 1
        return data

    def acked(self, mid: int) -> bool:
        """True when ``mid`` was a report's PUBACK."""
        if self.inflight.pop(mid, None) is None:
            return False
        self.sent += 1
        return True

    def lost(self) -> None:
        """The connection dropped: what was in flight is not sent again (a fresh report goes on reconnect)."""
        self.inflight.clear()
        self.pending = None
