"""What the agent serves and sends is bounded: label names and values, info keys, and values that are
not numbers. Applied by the sampler to every sample before it enters the ring, so the page, the
forwarded batches and the bridge all see the same bounded sample.

Labels (docs/payload.md, "Limits"):
- ``gpu_info`` carries at most ``MAX_INFO_KEYS`` keys beside the device labels (the identity keys the
  backends give first, then by name, so the same keys every sample). An info key must be a
  Prometheus label name (``[a-zA-Z_][a-zA-Z0-9_]*``) of at most ``MAX_NAME`` bytes, must not start with
  ``__`` (reserved by Prometheus) and must not be a label the agent or the bridge sets itself (the device
  labels, ``node``, ``job``, ``instance``); other keys are dropped and counted.
- A label value (device labels, info values, a series' own labels such as ``xid`` or ``sensor``) is at
  most ``MAX_VALUE`` bytes of UTF-8: a longer one is cut on a character boundary and ends in ``~`` and 12
  hex digits of its SHA-256, so that two long values that differ stay two values. Text that is not
  valid UTF-8 (lone surrogates) is replaced.

Values:
- NaN and ±Inf are dropped (the series is absent from that sample, as an unsupported reading is) and
  counted by metric and reason: every reading the catalog knows is a finite number, so a NaN is a
  library's or a sensor's fault, not news. Said once per metric and reason.
- A counter that goes backwards is sent as it is and counted: a GPU reset or a driver reload restarts
  NVML's energy counter, and Prometheus' ``rate()`` and ``increase()`` read a decrease as a restart, which
  is right here; dropping the value would hide the counter until it passed its old value again. The
  bridge decides what it stores (docs/bridge.md).
"""

from __future__ import annotations

import hashlib
import logging
import math
import operator
import re
import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, Metric

from gpu_exporter import catalog
from gpu_exporter.model import DeviceId, DeviceSample, Readings, Sample, SeriesKey

__all__ = ["MAX_INFO_KEYS", "MAX_NAME", "MAX_VALUE", "SampleBounds", "bound_value"]

log = logging.getLogger(__name__)

MAX_INFO_KEYS = 32
MAX_NAME = 128  # bytes of a label name
MAX_VALUE = 256  # bytes of a label value, in UTF-8
_HASH = 12  # hex digits of SHA-256 ending a cut value
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
RESERVED = frozenset(
    {"gpu", "uuid", "gpu_instance", "compute_instance", "mig_profile", "parent_uuid", "node", "job", "instance"}
)
_COUNTERS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")


# the keys the backends give, kept first when a device has more than MAX_INFO_KEYS
_PREFERRED: tuple[str, ...] = (
    "name",
    "serial",
    "uuid",
    "pci_bus_id",
    "device",
    "driver_version",
    "cuda_version",
    "vendor",
    "vbios_version",
    "memory",
)


def _rank(key: str) -> tuple[int, str]:
    return (_PREFERRED.index(key) if key in _PREFERRED else len(_PREFERRED), key)


def bound_value(value: str) -> str:
    """``value`` as a label value: valid UTF-8 of at most ``MAX_VALUE`` bytes (see the module doc)."""
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raw = value.encode("utf-8", "replace")
        value = raw.decode("utf-8")
    if len(raw) <= MAX_VALUE:
        return value
    digest = hashlib.sha256(raw).hexdigest()[:_HASH]
    head = raw[: MAX_VALUE - _HASH - 1].decode("utf-8", "ignore")  # a cut character goes whole
    return f"{head}~{digest}"


def _name_problem(key: str) -> str:
    """Why ``key`` cannot be an info label name ("" when it can)."""
    if key.startswith("__"):
        return "reserved"
    if key in RESERVED:
        return "reserved"
    if len(key.encode("utf-8", "replace")) > MAX_NAME or not _NAME.fullmatch(key):
        return "name"
    return ""


_HELD_MAX = 4096  # devices whose counters are held as a tuple (far more than a node has)


class _Facts:
    """What the bounds need of a key set, worked out once per key set (``Readings.memo``)."""

    __slots__ = ("counter_keys", "counters", "labels_short")

    def __init__(self, keys: tuple[SeriesKey, ...]) -> None:
        # no label value long enough that it might need cutting (only then can one be over MAX_VALUE bytes)
        self.labels_short = all(len(v) <= MAX_VALUE // 4 for _, labels in keys for v in labels)
        where = [i for i, (key, _) in enumerate(keys) if key in _COUNTERS]
        self.counter_keys = tuple(keys[i] for i in where)
        pick = operator.itemgetter(*where) if where else None
        # the counters' values, in the order of counter_keys
        self.counters: Callable[[tuple[float, ...]], tuple[float, ...]] = (
            (lambda numbers: ()) if pick is None else (lambda numbers: (pick(numbers),)) if len(where) == 1 else pick
        )


class SampleBounds:
    """Bounds one sample after another (the sampler's thread); counts what it changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.labels: dict[str, int] = {}  # reason -> labels dropped or values cut
        self.dropped: dict[tuple[str, str], int] = {}  # (metric, nan|inf) -> values dropped
        self.resets: dict[str, int] = {}  # metric -> counters that went backwards
        self._said: set[tuple[str, str]] = set()
        self._counters: dict[tuple[str, SeriesKey], float] = {}  # (device uuid, series) -> last value
        # device uuid -> (its key set, its counters' last values, their keys): the counters of a device whose
        # key set stays the same, as one tuple (they are in _counters only while not held here)
        self._held: dict[str, tuple[tuple[SeriesKey, ...], tuple[float, ...], tuple[SeriesKey, ...]]] = {}
        self._good_keys: set[str] = set()  # info keys already found valid

    def apply(self, sample: Sample) -> Sample:
        devices = tuple(self._device(ds) for ds in sample.devices)
        if all(a is b for a, b in zip(devices, sample.devices, strict=True)):
            return sample
        return Sample(sample.seq, sample.timestamp, devices, sample.duration)

    def _device(self, ds: DeviceSample) -> DeviceSample:
        device = self._device_id(ds.device)
        info = self._info(ds.info)
        values = ds.values
        if isinstance(values, Readings):
            facts: _Facts | None = values.memo.get("bounds")
            if facts is None:
                facts = values.memo["bounds"] = _Facts(values.keys_tuple)
            numbers = values.numbers()
            if facts.labels_short and math.isfinite(sum(numbers)):  # nothing to drop or cut: the common case
                self._watch_counters(device.uuid, values.keys_tuple, facts, numbers)
                if device is ds.device and info is ds.info:
                    return ds
                return DeviceSample(device, ds.up, values, info, ds.processes)
        self._flush(device.uuid)  # the series below are watched one by one
        changed = False
        kept: list[tuple[SeriesKey, float]] = []
        for series, value in ds.values.items():
            key, labels = series
            if not math.isfinite(value):
                self._drop(key, "nan" if math.isnan(value) else "inf")
                changed = True
                continue
            if any(len(v) > MAX_VALUE // 4 for v in labels):  # only then can one be over MAX_VALUE bytes
                cut = tuple(bound_value(v) for v in labels)
                if cut != labels:
                    self._count_label("value_length", sum(1 for a, b in zip(cut, labels, strict=True) if a != b))
                    series = (key, cut)
                    changed = True
            if key in _COUNTERS:
                self._watch_counter(device.uuid, series, value)
            kept.append((series, value))
        if device is ds.device and info is ds.info and not changed:
            return ds
        return DeviceSample(device, ds.up, dict(kept) if changed else ds.values, info, ds.processes)

    def _device_id(self, device: DeviceId) -> DeviceId:
        fields = device.fields()
        if all(len(f) <= MAX_VALUE // 4 for f in fields):
            return device
        cut = tuple(bound_value(f) for f in fields)
        if cut == fields:
            return device
        self._count_label("value_length", sum(1 for a, b in zip(cut, fields, strict=True) if a != b))
        return DeviceId(*cut)

    def _info(self, info: dict[str, str]) -> dict[str, str]:
        good = self._good_keys
        if (
            len(info) <= MAX_INFO_KEYS
            and all(k in good for k in info)
            and all(len(v) <= MAX_VALUE // 4 for v in info.values())
        ):
            return info
        out: dict[str, str] = {}
        for key in sorted(info, key=_rank):  # the identity keys the backends give first, then by name
            value = info[key]
            if key not in good:
                problem = _name_problem(key)
                if problem:
                    self._count_label(problem, 1, f"info key {key!r}")
                    continue
                good.add(key)
            if len(out) >= MAX_INFO_KEYS:
                self._count_label("info_keys", 1, f"info keys past {MAX_INFO_KEYS}")
                continue
            bounded = bound_value(str(value))
            if bounded != value:
                self._count_label("value_length", 1)
            out[key] = bounded
        return out if out != info else info

    def _watch_counters(
        self, uuid: str, keys: tuple[SeriesKey, ...], facts: _Facts, numbers: tuple[float, ...]
    ) -> None:
        """``_watch_counter`` for every counter of a device, at once: the device's counters are kept as one
        tuple while its key set stays the same (every cycle but when a reading comes or goes)."""
        now = facts.counters(numbers)
        held = self._held.get(uuid)
        if held is not None and held[0] is keys:
            if any(map(operator.lt, now, held[1])):  # a counter went backwards
                for series, value, last in zip(facts.counter_keys, now, held[1], strict=True):
                    if value < last:
                        self._reset(uuid, series, last, value)
        else:
            self._flush(uuid)
            for series, value in zip(facts.counter_keys, now, strict=True):
                before = self._counters.pop((uuid, series), None)
                if before is not None and value < before:
                    self._reset(uuid, series, before, value)
            if len(self._held) >= _HELD_MAX:  # devices that came and went: start afresh
                self._held.clear()
                self._counters.clear()
        self._held[uuid] = (keys, now, facts.counter_keys)

    def _flush(self, uuid: str) -> None:
        """The device's counters held as a tuple back into ``_counters``, one by one."""
        held = self._held.pop(uuid, None)
        if held is not None:
            self._counters.update(((uuid, series), value) for series, value in zip(held[2], held[1], strict=True))

    def _watch_counter(self, uuid: str, series: SeriesKey, value: float) -> None:
        slot = (uuid, series)
        last = self._counters.get(slot)
        self._counters[slot] = value
        if last is not None and value < last:
            self._reset(uuid, series, last, value)
        if len(self._counters) > 100_000:  # devices that came and went: start afresh
            self._counters.clear()

    def _reset(self, uuid: str, series: SeriesKey, last: float, value: float) -> None:
        with self._lock:
            self.resets[series[0]] = self.resets.get(series[0], 0) + 1
        self._say(
            series[0], "reset", "counter %s of %s went from %s to %s: sent as a restart", series[0], uuid, last, value
        )

    def _drop(self, key: str, reason: str) -> None:
        with self._lock:
            self.dropped[(key, reason)] = self.dropped.get((key, reason), 0) + 1
        self._say(key, reason, "a reading of %s was %s: dropped (absent from the sample), counted", key, reason.upper())

    def _count_label(self, reason: str, n: int, what: str = "") -> None:
        with self._lock:
            self.labels[reason] = self.labels.get(reason, 0) + n
        if what:
            self._say(what, reason, "%s: dropped (%s), counted in gpu_exporter_labels_limited_total", what, reason)

    def _say(self, key: str, reason: str, message: str, *args: object) -> None:
        if (key, reason) in self._said:
            return
        if len(self._said) < 10_000:
            self._said.add((key, reason))
        log.warning(message, *args)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            labels, dropped, resets = dict(self.labels), dict(self.dropped), dict(self.resets)
        limited = CounterMetricFamily(
            "gpu_exporter_labels_limited",
            "Labels the agent dropped or cut before serving and sending them: info_keys (past the limit), "
            "name (not a label name), reserved (__* or a label the agent sets), value_length (cut).",
            labels=["reason"],
        )
        for reason in ("info_keys", "name", "reserved", "value_length"):
            limited.add_metric([reason], labels.get(reason, 0))
        yield limited
        values = CounterMetricFamily(
            "gpu_exporter_values_dropped",
            "Readings dropped because they were not finite numbers (NaN, +Inf, -Inf), by metric.",
            labels=["metric", "reason"],
        )
        for (key, reason), count in sorted(dropped.items()):
            values.add_metric([key, reason], count)
        yield values
        restarts = CounterMetricFamily(
            "gpu_exporter_counter_resets",
            "Counters that went backwards between two samples (sent as they are: a restart), by metric.",
            labels=["metric"],
        )
        for key, count in sorted(resets.items()):
            restarts.add_metric([key], count)
        yield restarts
