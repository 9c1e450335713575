"""The spool's own counters of what it refused to read (``spool_disk``), as metrics."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, Metric

if TYPE_CHECKING:
    from gpu_exporter.forward.spool import Spool

__all__ = ["REASONS", "SpoolCollector"]

# spool_disk.Refused reasons, a key stored as not raw, and a damaged write-ahead log
REASONS = ("pickle", "text", "not_bytes", "file", "mode", "key", "wal")


class SpoolCollector:
    def __init__(self, spool: Spool) -> None:
        self._spool = spool

    def collect(self) -> Iterator[Metric]:
        spool = self._spool
        rejected = CounterMetricFamily(
            "gpu_exporter_forward_spool_rejected",
            "Spool rows not read because they were not raw bytes, by the form they had (pickle, text, "
            "not_bytes, file: a value file outside the spool, mode, key: a key not stored as text), moved "
            "aside and never interpreted; and damaged write-ahead logs (wal), which SQLite drops.",
            labels=["reason"],
        )
        counts = dict(spool.rejected)
        for reason in (*REASONS, *sorted(set(counts) - set(REASONS))):
            rejected.add_metric([reason], counts.get(reason, 0))
        yield rejected
        yield CounterMetricFamily(
            "gpu_exporter_forward_spool_wal_lost_bytes",
            "Bytes of damaged write-ahead logs that SQLite dropped (the batches in them cannot be counted).",
            value=spool.wal_lost_bytes,
        )
