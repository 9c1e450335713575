"""Summaries: what the forwarder sends first when full resolution does not fit the link.

A window of consecutive samples becomes one summary point per device: for each gauge series its
minimum, maximum, mean and last value (keys ``<key>:min``, ``<key>:max``, ``<key>:mean``,
``<key>:last``), for each counter its last value exactly (``<key>:last``; a counter's increase over the
window is the difference of two lasts). A gauge that moved in the window has its four figures rounded to
``digits`` significant digits (--mqtt.value-digits, integers such as bytes of memory included: a summary
is the coarse view, and at 4 digits it is a tenth smaller for 8 GPUs, some 2 s less of a 150 B/s link
per summary); with ``digits`` 0 they are exact and the mean has 5 digits. A gauge that held still over
the window (most do: limits, maximum clocks, PCIe link) sends its last value only, exactly; the bridge writes it as the
min, max and mean as well (bridge/summaries.py), which halves the size of a summary. The point carries the sequence number and timestamp of
the window's last sample. A summary batch is an ordinary payload with ``summary_ms`` (the window) set;
the bridge writes its values as ``<name>_min``, ``<name>_max``, ``<name>_mean``, ``<name>_last``, apart
from the raw series, which follow later (docs/forwarding.md, docs/payload.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gpu_exporter import catalog
from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey
from gpu_exporter.payload import Batch, encode

__all__ = ["COUNTERS", "EVENT_COUNTERS", "STATS", "Window", "encode_summary", "merge", "summarize"]

STATS = ("min", "max", "mean", "last")
COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")
# Counters an alert waits for (the catalog's ``event`` flag): in every summary whatever the link, and a
# change of one closes the open batch at once (forward/service.py's EVENT_KEYS).
EVENT_COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.event)


class _Stats:
    __slots__ = ("count", "high", "last", "low", "total")

    def __init__(self, v: float) -> None:
        self.count = 0
        self.total = 0.0
        self.low = self.high = math.nan
        self.last = v
        self.add(v)

    def add(self, v: float) -> None:
        self.last = v
        if math.isfinite(v):
            self.count += 1
            self.total += v
            self.low = v if self.count == 1 else min(self.low, v)
            self.high = v if self.count == 1 else max(self.high, v)


class Window:
    """A summary window filled one sample at a time: running statistics per device and series (a few
    numbers each, however long the window), so a window of hours costs no more memory than one of
    seconds. ``point()`` is what ``summarize`` returns for the same samples."""

    def __init__(self, counters: frozenset[str] = COUNTERS, digits: int = 0) -> None:
        self.counters = counters
        self.digits = digits  # significant digits of a moving gauge's figures (0: exact, the mean 5)
        self.samples = 0
        self.first: Sample | None = None
        self.last: Sample | None = None
        self._order: list[DeviceId] = []
        self._up: dict[DeviceId, bool] = {}
        self._stats: dict[DeviceId, dict[SeriesKey, _Stats]] = {}

    def add(self, sample: Sample) -> None:
        if self.first is None:
            self.first = sample
        self.last = sample
        self.samples += 1
        for dev in sample.devices:
            if dev.device not in self._up:
                self._order.append(dev.device)
            self._up[dev.device] = dev.up
            if not dev.up:
                continue
            mine = self._stats.setdefault(dev.device, {})
            for series, v in dev.values.items():
                found = mine.get(series)
                if found is None:
                    mine[series] = _Stats(v)
                else:
                    found.add(v)

    def point(self, counters_of: Callable[[int, DeviceId], bool] | None = None) -> Sample:
        """The summary point. ``counters_of(position, device)`` False leaves that device's counters out,
        except those an alert waits for (``EVENT_COUNTERS``): what a link too thin for all of them
        sends only every few windows (forward/adaptive.py)."""
        if self.last is None:
            raise ValueError("a summary needs at least one sample")
        devices = []
        for position, device in enumerate(self._order):
            up = self._up[device]
            with_counters = counters_of is None or counters_of(position, device)
            out: dict[SeriesKey, float] = {}
            for (key, labels), st in self._stats.get(device, {}).items():
                if key in self.counters:
                    if with_counters or key in EVENT_COUNTERS:
                        out[(f"{key}:last", labels)] = st.last
                    continue
                if not st.count or st.low == st.high == st.last:
                    out[(f"{key}:last", labels)] = st.last
                    continue  # held still (or never a number): the bridge writes the last value as min, max, mean
                digits = self.digits
                out[(f"{key}:last", labels)] = _short(st.last, digits)
                out[(f"{key}:min", labels)] = _short(st.low, digits)
                out[(f"{key}:max", labels)] = _short(st.high, digits)
                out[(f"{key}:mean", labels)] = _short(st.total / st.count, digits or 5)  # short decimals are cheap
            devices.append(DeviceSample(device, up or bool(out), out))  # no identity strings: gpu_info is raw
        return Sample(self.last.seq, self.last.timestamp, tuple(devices))


def _short(value: float, digits: int) -> float:
    """``value`` to ``digits`` significant digits (0: exact; NaN and infinities as they are)."""
    return float(f"{value:.{digits}g}") if digits and math.isfinite(value) else value


def summarize(samples: Sequence[Sample], counters: frozenset[str] = COUNTERS, digits: int = 0) -> Sample:
    """One summary point for a window of consecutive samples (at least one)."""
    window = Window(counters, digits)
    for sample in samples:
        window.add(sample)
    return window.point()


def merge(points: Sequence[tuple[Sample, float]], digits: int = 0) -> tuple[Sample, float]:
    """One summary point for consecutive ``(point, window seconds)``: min of the minima, max of the
    maxima, the mean weighted by window (to ``digits`` significant digits, 5 when 0), the last point's
    last values; the windows' total."""
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
            out[(f"{base}:mean", labels)] = _short(mean, digits or 5)
        devices.append(DeviceSample(dev.device, dev.up, out))
    return Sample(last.seq, last.timestamp, tuple(devices)), total


def encode_summary(node: str, boot: str, points: Sequence[Sample], window: float) -> bytes:
    """The payload of summary points (each from ``summarize``) over windows of ``window`` seconds."""
    return encode(Batch(node, boot, tuple(points), summary_ms=max(1, round(window * 1000))))
