"""The forwarder's own metrics (``gpu_exporter_forward_*``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ForwardMetrics"]


class ForwardMetrics:
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
