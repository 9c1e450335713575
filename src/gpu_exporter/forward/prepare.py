"""What the forwarder does to a sample as it takes it from the ring: keep the forwarded keys, round the
gauges, add the per-pod series, and tell whether it holds news an alert waits for (``EVENT_KEYS``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpu_exporter import catalog
from gpu_exporter.forward.summary import EVENT_COUNTERS
from gpu_exporter.model import DeviceSample, Sample, SeriesKey

__all__ = ["EVENT_KEYS", "OpenBatch", "has_event", "round_values"]

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


class OpenBatch:
    def __init__(self, now: float) -> None:
        self.samples: list[Sample] = []
        self.journal: list[str] = []
        self.opened = now
        self.device_samples = 0
        self.event = False  # holds a sample with news an alert waits for: close it now
