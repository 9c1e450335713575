"""Summaries: what the forwarder sends first when full resolution does not fit the link.

A window of consecutive samples becomes one summary point per device: for each gauge series its
minimum, maximum, mean and last value (keys ``<key>:min``, ``<key>:max``, ``<key>:mean``,
``<key>:last``), for each counter its last value exactly (``<key>:last``; a counter's increase over
the window is the difference of two lasts). The point carries the sequence number and timestamp of
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

__all__ = ["COUNTERS", "STATS", "encode_summary", "summarize"]

STATS = ("min", "max", "mean", "last")
COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")


def summarize(samples: Sequence[Sample], counters: frozenset[str] = COUNTERS) -> Sample:
    """One summary point for a window of consecutive samples (at least one)."""
    if not samples:
        raise ValueError("a summary needs at least one sample")
    last = samples[-1]
    order: list[DeviceId] = []
    seen: dict[DeviceId, tuple[bool, dict[str, str]]] = {}
    values: dict[DeviceId, dict[SeriesKey, list[float]]] = {}
    for sample in samples:
        for dev in sample.devices:
            if dev.device not in seen:
                order.append(dev.device)
            seen[dev.device] = (dev.up, dev.info)
            if not dev.up:
                continue
            mine = values.setdefault(dev.device, {})
            for series, v in dev.values.items():
                mine.setdefault(series, []).append(v)
    devices = []
    for device in order:
        up, info = seen[device]
        out: dict[SeriesKey, float] = {}
        for (key, labels), vs in values.get(device, {}).items():
            out[(f"{key}:last", labels)] = vs[-1]
            if key in counters:
                continue
            finite = [v for v in vs if math.isfinite(v)]
            if not finite:
                continue
            out[(f"{key}:min", labels)] = min(finite)
            out[(f"{key}:max", labels)] = max(finite)
            mean = math.fsum(finite) / len(finite)
            out[(f"{key}:mean", labels)] = float(f"{mean:.6g}")  # the codec stores short decimals cheaply
        devices.append(DeviceSample(device, up or bool(out), out, info))
    return Sample(last.seq, last.timestamp, tuple(devices))


def encode_summary(node: str, boot: str, points: Sequence[Sample], window: float) -> bytes:
    """The payload of summary points (each from ``summarize``) over windows of ``window`` seconds."""
    return encode(Batch(node, boot, tuple(points), summary_ms=max(1, round(window * 1000))))
