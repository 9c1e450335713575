"""Summaries: what the forwarder sends first when full resolution does not fit the link.

A window of consecutive samples becomes one summary point per device: for each gauge series its
minimum, maximum, mean (5 significant digits) and last value (keys ``<key>:min``, ``<key>:max``,
``<key>:mean``, ``<key>:last``), for each counter its last value exactly (``<key>:last``; a counter's
increase over the window is the difference of two lasts). A gauge that held still over the window
(most do: limits, maximum clocks, PCIe link) sends its last value only; the bridge writes it as the
min, max and mean as well (bridge/summaries.py), which halves the size of a summary. The point carries the sequence number and timestamp of
the window's last sample. A summary batch is an ordinary payload with ``summary_ms`` (the window) set;
the bridge writes its values as ``<name>_min``, ``<name>_max``, ``<name>_mean``, ``<name>_last``, apart
from the raw series, which follow later (docs/forwarding.md, docs/payload.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpu_exporter import catalog
from gpu_exporter.forward.batch import Batch, encode
from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey

__all__ = ["COUNTERS", "STATS", "encode_summary", "merge", "summarize"]

STATS = ("min", "max", "mean", "last")
COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")


def summarize(samples: Sequence[Sample], counters: frozenset[str] = COUNTERS) -> Sample:
    """One summary point for a window of consecutive samples (at least one)."""
    if not samples:
        raise ValueError("a summary needs at least one sample")
    last = samples[-1]
    order: list[DeviceId] = []
    seen: dict[DeviceId, bool] = {}
    values: dict[DeviceId, dict[SeriesKey, list[float]]] = {}
    for sample in samples:
        for dev in sample.devices:
            if dev.device not in seen:
                order.append(dev.device)
            seen[dev.device] = dev.up
            if not dev.up:
                continue
            mine = values.setdefault(dev.device, {})
            for series, v in dev.values.items():
                mine.setdefault(series, []).append(v)
    devices = []
    for device in order:
        up = seen[device]
        out: dict[SeriesKey, float] = {}
        for (key, labels), vs in values.get(device, {}).items():
            out[(f"{key}:last", labels)] = vs[-1]
            if key in counters:
                continue
            finite = [v for v in vs if math.isfinite(v)]
            low, high = (min(finite), max(finite)) if finite else (vs[-1], vs[-1])
            if low == high == vs[-1]:
                continue  # held still: min, max and mean are the last value (the bridge writes them so)
            out[(f"{key}:min", labels)] = low
            out[(f"{key}:max", labels)] = high
            mean = math.fsum(finite) / len(finite)
            out[(f"{key}:mean", labels)] = float(f"{mean:.5g}")  # the codec stores short decimals cheaply
        devices.append(DeviceSample(device, up or bool(out), out))  # no identity strings: gpu_info is raw
    return Sample(last.seq, last.timestamp, tuple(devices))


def merge(points: Sequence[tuple[Sample, float]]) -> tuple[Sample, float]:
    """One summary point for consecutive ``(point, window seconds)``: min of the minima, max of the
    maxima, the mean weighted by window, the last point's last values; the windows' total."""
    total = sum(span for _, span in points) or 1.0
    last = points[-1][0]
    stats: dict[DeviceId, dict[SeriesKey, list[tuple[float, float, float, float]]]] = {}
    for point, span in points:
        for dev in point.devices:
            mine = stats.setdefault(dev.device, {})
            for (key, labels), v in dev.values.items():
                base, _, stat = key.partition(":")
                if stat != "last":
                    continue
                low = dev.values.get((f"{base}:min", labels), v)
                high = dev.values.get((f"{base}:max", labels), v)
                mean = dev.values.get((f"{base}:mean", labels), v)
                mine.setdefault((base, labels), []).append((low, high, mean, span))
    devices = []
    for dev in last.devices:
        out: dict[SeriesKey, float] = {}
        for (base, labels), rows in stats.get(dev.device, {}).items():
            found = dev.values.get((f"{base}:last", labels))
            if found is None:
                continue
            out[(f"{base}:last", labels)] = found
            low, high = min(r[0] for r in rows), max(r[1] for r in rows)
            if base in COUNTERS or low == high == found:
                continue
            out[(f"{base}:min", labels)] = low
            out[(f"{base}:max", labels)] = high
            mean = math.fsum(r[2] * r[3] for r in rows) / (sum(r[3] for r in rows) or 1.0)
            out[(f"{base}:mean", labels)] = float(f"{mean:.5g}")
        devices.append(DeviceSample(dev.device, dev.up, out))
    return Sample(last.seq, last.timestamp, tuple(devices)), total


def encode_summary(node: str, boot: str, points: Sequence[Sample], window: float) -> bytes:
    """The payload of summary points (each from ``summarize``) over windows of ``window`` seconds."""
    return encode(Batch(node, boot, tuple(points), summary_ms=max(1, round(window * 1000))))
