"""The forwarder's own metrics (``gpu_exporter_forward_*``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpu_exporter.selfmetrics import Declare

__all__ = ["ForwardMetrics"]

DROP_REASONS = ("max_bytes", "max_age", "corrupt", "disk_full", "too_large")
CONNECT_ERRORS = ("unreachable", "refused", "auth", "tls", "lost", "qos", "protocol", "timeout")


class ForwardMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        m = Declare(registry, "gpu_exporter_forward_")
        self.connected = m.gauge("connected", "1 while connected to the MQTT broker.")
        self.batches = m.counter("published_batches", "Batches acknowledged by the broker.")
        self.samples = m.counter("published_samples", "Samples in acknowledged batches.")
        self.bytes = m.counter("published_bytes", "Payload bytes of acknowledged batches.")
        self.publish_errors = m.counter(
            "publish_errors", "Batches the client or broker refused, or whose connection dropped before the PUBACK."
        )
        self.connect_errors = m.counter(
            "connect_errors", "Failed or lost broker connections, by kind.", ["kind"], CONNECT_ERRORS
        )
        self.spool_batches = m.gauge("spool_batches", "Batches waiting in the spool.")
        self.spool_bytes = m.gauge("spool_bytes", "Payload bytes waiting in the spool.")
        self.spool_oldest = m.gauge("spool_oldest_age_seconds", "Age of the oldest batch in the spool.")
        self.spool_errors = m.counter(
            "spool_write_errors", "Spool writes the disk refused (full, read-only, I/O error)."
        )
        self.dropped_batches = m.counter(
            "dropped_batches",
            "Batches dropped before the broker acknowledged them, by reason.",
            ["reason"],
            DROP_REASONS,
        )
        self.dropped_samples = m.counter(
            "dropped_samples", "Samples in dropped batches, by reason.", ["reason"], DROP_REASONS
        )
        self.missed = m.counter("missed_samples", "Samples overwritten in the ring before the forwarder read them.")
        self.backlog = m.gauge("replay_backlog_batches", "Spooled batches waiting to be replayed after an outage.")
        self.internal_errors = m.counter(
            "internal_errors", "Unexpected errors in the forwarder thread (each one retried after a backoff)."
        )
        self.working = m.gauge(
            "working",
            "1 while forwarding works; 0 when the forwarder fails, the broker refuses it, or it has been "
            "disconnected for over 2 minutes (samples wait in the spool meanwhile).",
        )
        self.refused = m.counter(
            "refused_publishes", "Batches the broker refused with an MQTT 5 reason code (resent after a backoff)."
        )
