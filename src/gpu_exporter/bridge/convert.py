"""Decoded batches to remote-write series: catalog names, device labels, and the node label.

Each value becomes a sample of the series ``<catalog name>{<device labels>, <constant labels>,
<dynamic labels>, node="<node>"}`` at the sample's original timestamp, so that the cloud sees the same
series the node's /metrics page shows, plus ``node``. Each device present in a sample also yields
``gpu_up`` (1 or 0) and, when it has identity strings, ``gpu_info{...} 1``, as on the /metrics page
(exposition.native_view).

Label sets are cached: the same node, device and metric give the same tuple batch after batch. Series
that have a value in every sample of a batch share one timestamp list, which lets the encoder pack
them with one plan (see remote_write.WriteEncoder).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpu_exporter import catalog
from gpu_exporter.bridge import labels
from gpu_exporter.bridge.columns import ColumnBatch
from gpu_exporter.bridge.limits import SeriesBudget
from gpu_exporter.bridge.remote_write import Series, encode_labels
from gpu_exporter.bridge.values import COUNTER_KEYS, Counters, drop_nonfinite
from gpu_exporter.model import DeviceId, SeriesKey

__all__ = ["INFO_METRIC", "UP_METRIC", "Converted", "Converter"]

UP_METRIC = "gpu_up"
INFO_METRIC = "gpu_info"


# A series is remembered only by its encoded Label fields (the protobuf bytes of its sorted labels):
# about a third of the memory of keeping the label tuples too, and bytes cache their hash, so they are
# cheap dictionary keys when the series of several batches are merged. ``_LIMITED`` (empty, so falsy
# like None) marks a series its node may not create (--bridge.max-series-per-node).
_Entry = bytes
_LIMITED = b""
# The cache counts in units of one typical entry with its dictionary slot and key (~300 bytes): a
# longer entry (long label values) counts as several, a device's own bookkeeping as a few, so that
# ``cache_size`` bounds memory, not only the number of entries.
_UNIT = 300
_DEVICE_UNITS = 4


def _entry(labels: Iterable[tuple[str, str]]) -> bytes:
    return encode_labels(tuple(sorted(labels)))


# A device's plan (the entry of each metric of a batch) is kept for the next batch only for a metrics list
# up to this long (a device has some 90 series, a MIG node's with pods a few thousand): a longer one, a
# node inventing series, would keep every series it named alive through the plan.
PLAN_LIMIT = 4096


class _Plan:
    """The entries of one metrics list on one device, and where its written counters are."""

    __slots__ = ("counter_keys", "counter_positions", "entries", "limited", "unknown")

    def __init__(self, metrics: tuple[SeriesKey, ...], entries: list[_Entry | None], absent: tuple[bool, ...]) -> None:
        self.entries = entries
        self.unknown = {m[0] for m, e, a in zip(metrics, entries, absent, strict=True) if e is None and not a}
        self.limited = entries.count(_LIMITED)  # entries its node may not create
        positions = [j for j, (m, e) in enumerate(zip(metrics, entries, strict=True)) if e and m[0] in COUNTER_KEYS]
        self.counter_positions = positions
        self.counter_keys = tuple(metrics[j] for j in positions)


class _Device:
    """What the converter remembers about one device of one node."""

    __slots__ = ("counters", "info", "metrics", "plan", "series", "up", "why")

    def __init__(self) -> None:
        self.series: dict[SeriesKey, _Entry | None] = {}
        self.up: _Entry | None = None
        self.info: dict[tuple[tuple[str, str], ...], _Entry] = {}
        # the metrics list ``plan`` was made for, and which of its columns were absent
        self.metrics: tuple[tuple[SeriesKey, ...], tuple[bool, ...]] | None = None
        self.plan: _Plan | None = None
        self.why = "node"  # the series limit that refused the last series refused: "node" or "fleet"
        self.counters: Counters | None = None  # high marks of its counters (bridge/values.py)


@dataclass
class Converted:
    series: list[Series] = field(default_factory=list)
    gpu_samples: int = 0  # (sample, device) pairs
    newest_ms: int | None = None
    unknown_keys: set[str] = field(default_factory=set)
    # values dropped by a series limit, by (node, "node" or "fleet")
    limited: dict[tuple[str, str], int] = field(default_factory=dict)
    # values dropped by the value policy (bridge/values.py), by (node, reason)
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    # identity labels left out of gpu_info (bridge/labels.py), by (node, reason)
    labels_dropped: dict[tuple[str, str], int] = field(default_factory=dict)


class Converter:
    """Turns batches into series. Not thread-safe: one per writer thread."""

    def __init__(
        self,
        node_label: str = "node",
        cache_size: int = 1_000_000,
        max_series_per_node: int = 1_000_000,
        max_series: int = 10_000_000,
        budget: SeriesBudget | None = None,
    ) -> None:
        if labels.refusal(node_label) is not None:
            raise ValueError(f"invalid node label name {node_label!r}")
        self.node_label = node_label
        self._cache_size = cache_size
        self._devices: dict[tuple[str, DeviceId], _Device] = {}
        self._cached = 0
        self.budget = budget or SeriesBudget(max_series_per_node, max_series)
        self._reserved = frozenset(("__name__", node_label, *(f.name for f in dataclasses.fields(DeviceId))))

    def _device_cache(self, node: str, device: DeviceId) -> _Device:
        key = (node, device)
        cache = self._devices.get(key)
        if cache is None:
            self._count(_DEVICE_UNITS)
            cache = self._devices[key] = _Device()
        return cache

    def _count(self, units: int) -> None:
        """Account for what is about to be cached; over the bound, start over (bounded memory)."""
        if self._cached + units > self._cache_size:
            self._devices.clear()
            self._cached = 0
        self._cached += units

    def _admit(self, node: str, entry: _Entry, cache: _Device) -> _Entry:
        """``entry``, or ``_LIMITED`` when it would be one series too many for ``node`` or the fleet."""
        if self.budget.admit(node, entry):
            return entry
        cache.why = self.budget.refused
        return _LIMITED

    def _labels(
        self,
        node: str,
        device: DeviceId,
        cache: _Device,
        series: SeriesKey,
    ) -> _Entry | None:
        """The labels of one catalog series on one device, None for an unknown key."""
        try:
            return cache.series[series]
        except KeyError:
            pass
        key, dynamic = series
        base, _, stat = key.partition(":")  # "<key>:max" in a summary batch: the series <name>_max
        try:
            metric = catalog.by_key(base)
        except KeyError:
            entry: _Entry | None = None
        else:
            name = f"{metric.name}_{stat}" if stat else metric.name
            pairs = [("__name__", name), *device.labels(), *metric.const_labels]
            pairs += zip(metric.labels, dynamic, strict=False)
            pairs.append((self.node_label, node))
            entry = self._admit(node, _entry(pairs), cache)
            if not entry:
                return entry  # not cached: a node past its limit cannot grow the cache either
        self._count(1 + len(entry or b"") // _UNIT)  # may start over: this device's cache lives on
        cache.series[(sys.intern(key), dynamic)] = entry
        return entry

    def _entries(
        self,
        node: str,
        device: DeviceId,
        cache: _Device,
        metrics: tuple[SeriesKey, ...],
        columns: list[list[float | None] | None],
    ) -> _Plan:
        """The entry of each of a batch's metrics on one device (None where the device has no column);
        remade only when the metrics list or the set of columns present changes. Only series with a
        column count against the node's series limit."""
        absent = tuple(map(operator.is_, columns, itertools.repeat(None)))
        if cache.plan is not None and cache.metrics == (metrics, absent):
            return cache.plan
        entries = [None if a else self._labels(node, device, cache, m) for m, a in zip(metrics, absent, strict=True)]
        plan = _Plan(metrics, entries, absent)
        if len(metrics) <= PLAN_LIMIT:
            cache.plan, cache.metrics = plan, (metrics, absent)
        else:
            cache.plan = cache.metrics = None
        return plan

    def convert(self, items: Iterable[tuple[ColumnBatch, list[int] | None]]) -> Converted:
        """Series for each batch's samples at the given positions (None: all of them)."""
        out = Converted()
        if self.budget.rotate_due():  # each active series is admitted again, into the new window
            self._devices.clear()
            self._cached = 0
        pieces: list[tuple[_Entry, list[int], list[float]]] = []
        add = pieces.append

        def first_time(item: tuple[ColumnBatch, list[int] | None]) -> int:
            batch, keep = item
            return batch.times_ms[keep[0] if keep else 0]

        ordered = sorted((i for i in items if i[1] is None or i[1]), key=first_time)
        for batch, keep in ordered:
            node = batch.node
            times = batch.times_ms if keep is None else [batch.times_ms[i] for i in keep]
            n = len(times)
            if out.newest_ms is None or times[-1] > out.newest_ms:
                out.newest_ms = max(times)
            metrics = tuple(batch.metrics)
            for dev in batch.devices:
                cache = self._device_cache(node, dev.device)
                up = dev.up if keep is None else [dev.up[i] for i in keep]
                if None not in up and 0 not in up:  # the common case: present and answering throughout
                    answering = None
                    out.gpu_samples += n
                    stamps_up = times
                    flags = [1.0] * n
                else:
                    present = [i for i, u in enumerate(up) if u is not None]
                    answering = [i for i in present if up[i]]
                    out.gpu_samples += len(present)
                    stamps_up = [times[i] for i in present]
                    flags = [float(up[i]) for i in present]  # type: ignore[arg-type]
                if not stamps_up:
                    continue
                if batch.summary_ms:  # gpu_up and gpu_info come with the raw samples
                    up_entry, info_entry = _LIMITED, None
                else:
                    up_entry, info_entry = self._device_labels(node, dev.device, dev.info, cache, out)
                    if up_entry:
                        add((up_entry, stamps_up, flags))
                    else:
                        _add(out.limited, (node, cache.why), len(stamps_up))
                if info_entry:
                    add((info_entry, stamps_up, [1.0] * len(stamps_up)))
                if answering is not None and not answering:
                    continue  # like the /metrics page: a device that did not answer has no values
                plan = self._entries(node, dev.device, cache, metrics, dev.columns)
                gaps = self._screen(batch, plan, dev.columns, cache, dev.nonfinite, dev.counters_rising, out)
                gaps |= dev.gaps
                if plan.unknown:
                    out.unknown_keys |= plan.unknown
                if plan.limited:
                    _add(out.limited, (node, cache.why), plan.limited * n)
                if keep is None and answering is None and not gaps:  # the common case, in one C loop
                    pieces += [  # no gaps: no column holds a None
                        (e, times, c)  # type: ignore[misc]
                        for e, c in zip(plan.entries, dev.columns, strict=True)
                        if c is not None and e
                    ]
                    continue
                for entry, col in zip(plan.entries, dev.columns, strict=True):
                    if col is None or not entry:
                        continue
                    if keep is not None:
                        col = [col[i] for i in keep]
                    if answering is None and None not in col:
                        add((entry, times, col))  # type: ignore[arg-type]
                        continue
                    positions = range(n) if answering is None else answering
                    points = [(times[i], v) for i in positions if (v := col[i]) is not None]
                    if points:
                        add((entry, [t for t, _ in points], [v for _, v in points]))
        if len({b.node for b, _ in ordered}) == len(ordered):  # one batch per node: no series twice
            out.series = [Series((), t, v, e) for e, t, v in pieces]
            return out
        parts: dict[_Entry, list[tuple[list[int], list[float]]]] = {}
        for entry, stamps, values in pieces:
            found = parts.get(entry)
            if found is None:
                parts[entry] = [(stamps, values)]
            else:
                found.append((stamps, values))
        joined: dict[tuple[int, ...], list[int]] = {}
        for entry, group in parts.items():
            if len(group) == 1:
                out.series.append(Series((), group[0][0], group[0][1], entry))
                continue
            ids = tuple(id(p[0]) for p in group)
            ts_all = joined.get(ids)
            if ts_all is None:
                ts_all = joined[ids] = [t for p in group for t in p[0]]
            values = [v for p in group for v in p[1]]
            if any(b <= a for a, b in itertools.pairwise(ts_all)):
                merged = sorted(dict(zip(ts_all, values, strict=True)).items())
                out.series.append(Series((), [t for t, _ in merged], [v for _, v in merged], entry))
            else:
                out.series.append(Series((), ts_all, values, entry))
        return out

    def _screen(
        self,
        batch: ColumnBatch,
        plan: _Plan,
        columns: list[list[float | None] | None],
        cache: _Device,
        nonfinite: bool,
        rising: bool,
        out: Converted,
    ) -> bool:
        """The value policy (bridge/values.py) on one device's columns, in place; True when it made gaps."""
        dropped: dict[str, int] = {}
        gaps = drop_nonfinite(columns, dropped) if nonfinite else False
        # a summary's "<counter>:last" is its own series, checked in its raw batch
        if plan.counter_positions and not batch.summary_ms:
            counters = cache.counters
            if counters is None:
                counters = cache.counters = Counters()
            counters.plan(plan.counter_keys, plan.counter_positions)
            gaps |= counters.screen(batch.boot, batch.seqs, columns, dropped, rising)
        for reason, count in dropped.items():
            _add(out.dropped, (batch.node, reason), count)
        return gaps

    def _device_labels(
        self, node: str, device: DeviceId, info: dict[str, str], cache: _Device, out: Converted
    ) -> tuple[_Entry, _Entry | None]:
        """The entries of ``gpu_up`` and (with identity strings) ``gpu_info`` for one device."""
        up = cache.up
        if up is None:
            up = _entry([("__name__", UP_METRIC), *device.labels(), (self.node_label, node)])
            self._count(1 + len(up) // _UNIT)
            up = cache.up = self._admit(node, up, cache)
        if not info:
            return up, None
        key = tuple(info.items())
        found = cache.info.get(key)
        if found is None:
            if len(cache.info) > 16:  # identity strings change rarely (a driver update)
                cache.info.clear()
            pairs, dropped = labels.info_labels(info, self._reserved)
            for reason, count in dropped.items():
                _add(out.labels_dropped, (node, reason), count)
            pairs += [*device.labels(), ("__name__", INFO_METRIC), (self.node_label, node)]
            found = _entry(pairs)
            self._count(1 + len(found) // _UNIT)
            found = cache.info[key] = self._admit(node, found, cache)
        return up, found

    def knows(self, node: str) -> bool:
        """Whether ``node`` has active series (a name the bridge knows)."""
        return self.budget.knows(node)


def _add(counts: dict[tuple[str, str], int], key: tuple[str, str], n: int) -> None:
    counts[key] = counts.get(key, 0) + n
