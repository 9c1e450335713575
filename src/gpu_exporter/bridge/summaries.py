"""Summary batches (forward/summary.py) made whole before they are converted.

A gauge that held still over a summary window travels as its last value alone (``<key>:last``, no
``:min``, ``:max`` or ``:mean``). ``complete`` gives such a point its minimum, maximum and mean: the last
value, so that a dashboard's ``<name>_max`` has no gap where the reading did not move. Counters have a
last value only; keys the catalog does not know are left as they are.
"""

from __future__ import annotations

import dataclasses

from gpu_exporter import catalog
from gpu_exporter.model import SeriesKey
from gpu_exporter.payload.columns import ColumnBatch, ColumnDevice

__all__ = ["complete"]

_FILLED = ("min", "max", "mean")


def _gauge(key: str) -> bool:
    try:
        return catalog.by_key(key).type == "gauge"
    except KeyError:
        return False


def complete(batch: ColumnBatch) -> ColumnBatch:
    """``batch`` with every gauge's min, max and mean where only its last value travelled."""
    if not batch.summary_ms:
        return batch
    metrics = list(batch.metrics)
    index = {m: j for j, m in enumerate(metrics)}
    fills: list[tuple[int, int]] = []  # (column of the last value, column to fill)
    for j, (key, labels) in enumerate(batch.metrics):
        base, _, stat = key.partition(":")
        if stat != "last" or not _gauge(base):
            continue
        for other in _FILLED:
            series: SeriesKey = (f"{base}:{other}", labels)
            if series not in index:
                index[series] = len(metrics)
                metrics.append(series)
            fills.append((j, index[series]))
    if not fills:
        return batch
    n = len(batch.seqs)
    devices = []
    for dev in batch.devices:
        columns = [*dev.columns, *([None] * (len(metrics) - len(dev.columns)))]
        gaps = dev.gaps
        for source, target in fills:
            last = columns[source]
            if last is None:
                continue
            have = columns[target]
            if have is None:
                columns[target] = list(last)
            elif None in have:
                columns[target] = [last[i] if have[i] is None else have[i] for i in range(n)]
            else:
                continue
            gaps = gaps or None in last
        devices.append(ColumnDevice(dev.device, dev.info, dev.up, columns, gaps))
    return dataclasses.replace(batch, metrics=metrics, devices=devices)
