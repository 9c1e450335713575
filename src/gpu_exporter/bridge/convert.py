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

import bisect
import itertools
import operator
import re
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpu_exporter import catalog
from gpu_exporter.bridge.columns import ColumnBatch
from gpu_exporter.bridge.remote_write import Series, encode_labels
from gpu_exporter.model import DeviceId, SeriesKey

__all__ = ["INFO_METRIC", "UP_METRIC", "Converted", "Converter", "SeriesLimits"]

UP_METRIC = "gpu_up"
INFO_METRIC = "gpu_info"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


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


class _Device:
    """What the converter remembers about one device of one node: its own label fields, not its series.

    A series' encoded labels are the Label fields of all its labels sorted by name; those of the
    device (``gpu``, ``uuid``, MIG labels) and the node are this device's own, the others (``__name__``,
    constant and dynamic labels) the metric's, the same on every device. So an entry is composed per
    batch from a recipe shared by the whole fleet (``Converter._recipe``) and this device's label
    fields (``runs``): a join of a few byte strings, instead of a cache of ~370 bytes per series that a
    fleet larger than the cache rebuilt for every message.
    """

    __slots__ = ("allowed", "generation", "info", "limited", "metrics", "names", "recipes", "runs", "unknown", "up")

    def __init__(self, names: tuple[str, ...], fields: tuple[bytes, ...]) -> None:
        self.names = names  # the device's label names and the node label, sorted
        k = len(fields)
        # runs[i * (k + 1) + j]: the Label fields of names[i:j] joined (what a recipe's slot refers to)
        self.runs = [b"".join(fields[i:j]) for i in range(k + 1) for j in range(k + 1)]
        self.up: _Entry | None = None
        self.info: dict[tuple[tuple[str, str], ...], _Entry] = {}
        # the metrics list the recipes were made for, and which of its columns were absent
        self.metrics: tuple[tuple[SeriesKey, ...], tuple[bool, ...]] | None = None
        self.recipes: list[_Recipe | None] = []
        self.allowed: list[bool] = []  # per recipe: within the node's series limit (kept only if not all)
        self.generation = -1  # of the series limits when ``allowed`` was decided
        self.unknown: set[str] = set()
        self.limited = 0  # recipes its node may not create


# A recipe: the Label fields of a series in order, each part either fixed bytes (the metric's labels) or
# the index of a run of the device's own fields (``_Device.runs``).
_Recipe = tuple[bytes | int, ...]


@dataclass
class _Plan:
    entries: list[_Entry | None]
    unknown: set[str]
    limited: int


_MISSING = object()
# Bounds of what the fleet shares (a normal node uses ~100 recipes and one plan of ~100 keys): a node
# that floods series with new label values churns these caches, it cannot grow them.
_MAX_RECIPES = 20_000
_MAX_PLAN_KEYS = 2_000  # a plan of more series than this is not shared
_MAX_PLANS_KEYS = 200_000  # series keys in all shared plans together


def _field(name: str, value: str) -> bytes:
    return encode_labels(((name, value),))


@dataclass
class Converted:
    series: list[Series] = field(default_factory=list)
    gpu_samples: int = 0  # (sample, device) pairs
    newest_ms: int | None = None
    unknown_keys: set[str] = field(default_factory=set)
    limited: dict[str, int] = field(default_factory=dict)  # values dropped per node by the series limit


class Converter:
    """Turns batches into series. Not thread-safe: one per writer thread."""

    def __init__(
        self, node_label: str = "node", cache_size: int = 1_000_000, max_series_per_node: int = 1_000_000
    ) -> None:
        if not _LABEL_NAME.match(node_label) or node_label.startswith("__"):
            raise ValueError(f"invalid node label name {node_label!r}")
        self.node_label = node_label
        self._cache_size = cache_size
        self._devices: dict[tuple[str, DeviceId], _Device] = {}
        self._cached = 0
        self._limits = SeriesLimits(max_series_per_node, cache_size)
        self._recipes: dict[tuple[SeriesKey, tuple[str, ...]], _Recipe | None] = {}
        self._plan_keys = 0
        self._plans: dict[
            tuple[tuple[SeriesKey, ...], tuple[bool, ...], tuple[str, ...]],
            tuple[tuple[tuple[SeriesKey, ...], tuple[bool, ...]], list[_Recipe | None], set[str]],
        ] = {}

    def _device_cache(self, node: str, device: DeviceId) -> _Device:
        key = (node, device)
        cache = self._devices.get(key)
        if cache is None:
            pairs = sorted([*device.labels(), (self.node_label, node)])
            self._count(_DEVICE_UNITS)
            cache = self._devices[key] = _Device(tuple(n for n, _ in pairs), tuple(_field(n, v) for n, v in pairs))
        return cache

    def _count(self, units: int) -> None:
        """Account for what is about to be cached; over the bound, start over (bounded memory)."""
        if self._cached + units > self._cache_size:
            self._devices.clear()
            self._cached = 0
        self._cached += units

    def _admit(self, node: str, entry: _Entry) -> _Entry:
        """``entry``, or ``_LIMITED`` when it would be one series too many for ``node``."""
        return entry if self._limits.admit(node, entry) else _LIMITED

    def _recipe(self, series: SeriesKey, names: tuple[str, ...]) -> _Recipe | None:
        """How to compose the labels of one catalog series on devices with label ``names``; None for an
        unknown key. Shared by every device of the fleet with the same label names."""
        found = self._recipes.get((series, names), _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        key, dynamic = series
        base, _, stat = key.partition(":")  # "<key>:max" in a summary batch: the series <name>_max
        try:
            metric = catalog.by_key(base)
        except KeyError:
            recipe: _Recipe | None = None
        else:
            name = f"{metric.name}_{stat}" if stat else metric.name
            fixed = [("__name__", name), *metric.const_labels, *zip(metric.labels, dynamic, strict=False)]
            slots = {n: i for i, n in enumerate(names)}
            k = len(names)
            parts: list[bytes | int] = []
            run: list[int] = []  # slots of the current run of device fields (consecutive: both sorted)
            for n, v, slot in sorted([(n, v, -1) for n, v in fixed] + [(n, "", slots[n]) for n in names]):
                if slot >= 0:
                    run.append(slot)
                    continue
                if run:
                    parts.append(run[0] * (k + 1) + run[-1] + 1)
                    run = []
                if parts and isinstance(parts[-1], bytes):
                    parts[-1] += _field(n, v)
                else:
                    parts.append(_field(n, v))
            if run:
                parts.append(run[0] * (k + 1) + run[-1] + 1)
            recipe = tuple(parts)
        if len(self._recipes) >= _MAX_RECIPES:  # dynamic label values (XID codes) are many at worst
            self._recipes.clear()
        self._recipes[(sys.intern(key), dynamic), names] = recipe
        return recipe

    def _entries(
        self,
        node: str,
        cache: _Device,
        metrics: tuple[SeriesKey, ...],
        columns: list[list[float | None] | None],
    ) -> _Plan:
        """The entry of each of a batch's metrics on one device (None where the device has no column),
        composed for this batch; the recipes are remade only when the metrics list or the set of
        columns present changes. Only series with a column count against the node's series limit."""
        absent = tuple(map(operator.is_, columns, itertools.repeat(None)))
        runs = cache.runs
        if cache.metrics != (metrics, absent):
            # One plan per (metrics list, columns present, device label names), shared by every device
            # that sends the same: a device holds a reference, not its own copy of a batch's metrics.
            key = (metrics, absent, cache.names)
            plan = self._plans.get(key)
            if plan is None:
                names = cache.names
                recipes = [None if a else self._recipe(m, names) for m, a in zip(metrics, absent, strict=True)]
                unknown = {m[0] for m, r, a in zip(metrics, recipes, absent, strict=True) if r is None and not a}
                plan = ((metrics, absent), recipes, unknown)
                if len(metrics) <= _MAX_PLAN_KEYS:  # a flood of series is not kept for the next device
                    self._plan_keys += len(metrics)
                    if self._plan_keys > _MAX_PLANS_KEYS:
                        self._plans.clear()
                        self._plan_keys = len(metrics)
                    self._plans[key] = plan
            cache.metrics, cache.recipes, cache.unknown = plan
            cache.generation = -1
        entries = [
            None if r is None else b"".join([runs[p] if p.__class__ is int else p for p in r])  # type: ignore[misc]
            for r in cache.recipes
        ]
        if cache.generation != self._limits.generation:  # new recipes, or the limits started over
            allowed = [e is None or bool(self._admit(node, e)) for e in entries]
            cache.limited = allowed.count(False)
            cache.allowed = allowed if cache.limited else []  # kept only where something is limited
            cache.generation = self._limits.generation
        if cache.limited:
            entries = [e if ok else _LIMITED for e, ok in zip(entries, cache.allowed, strict=True)]
        return _Plan(entries, cache.unknown, cache.limited)

    def convert(self, items: Iterable[tuple[ColumnBatch, list[int] | None]]) -> Converted:
        """Series for each batch's samples at the given positions (None: all of them)."""
        out = Converted()
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
                up_entry, info_entry = self._device_labels(node, dev.device, dev.info, cache)
                if batch.summary_ms:  # gpu_up and gpu_info come with the raw samples
                    up_entry, info_entry = _LIMITED, None
                elif up_entry:
                    add((up_entry, stamps_up, flags))
                else:
                    out.limited[node] = out.limited.get(node, 0) + len(stamps_up)
                if info_entry:
                    add((info_entry, stamps_up, [1.0] * len(stamps_up)))
                if answering is not None and not answering:
                    continue  # like the /metrics page: a device that did not answer has no values
                plan = self._entries(node, cache, metrics, dev.columns)
                if plan.unknown:
                    out.unknown_keys |= plan.unknown
                if plan.limited:
                    out.limited[node] = out.limited.get(node, 0) + plan.limited * n
                if keep is None and answering is None and not dev.gaps:  # the common case, in one C loop
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

    def _device_labels(
        self, node: str, device: DeviceId, info: dict[str, str], cache: _Device
    ) -> tuple[_Entry, _Entry | None]:
        """The entries of ``gpu_up`` and (with identity strings) ``gpu_info`` for one device."""
        up = cache.up
        if up is None:
            up = _entry([("__name__", UP_METRIC), *device.labels(), (self.node_label, node)])
            self._count(1 + len(up) // _UNIT)
            up = cache.up = self._admit(node, up)
        if not info:
            return up, None
        key = tuple(info.items())
        found = cache.info.get(key)
        if found is None:
            if len(cache.info) > 16:  # identity strings change rarely (a driver update)
                cache.info.clear()
            pairs = dict(key)
            pairs.update(device.labels())
            pairs["__name__"] = INFO_METRIC
            pairs[self.node_label] = node
            found = _entry((k, v) for k, v in pairs.items() if _LABEL_NAME.match(k))
            self._count(1 + len(found) // _UNIT)
            found = cache.info[key] = self._admit(node, found)
        return up, found


class SeriesLimits:
    """Distinct series per node, each remembered as the 64-bit hash of its encoded labels.

    A node may create up to ``per_node`` series; further ones are refused. The hashes of all nodes
    together are bounded by ``total`` (the series cache's size): past it, every count starts over, so
    the limit is "per node since the bridge started, or since the fleet last filled the cache".

    A node's hashes are kept sorted in an ``array('q')``: 8 bytes per series, where a set of Python ints
    took about 64 (a 1,000-node fleet of 8-GPU nodes: about 7 MB instead of about 50). The converter asks
    only when a device's set of series changes, so a lookup by bisection costs nothing that matters.
    """

    def __init__(self, per_node: int, total: int) -> None:
        self.per_node = per_node
        self._total = max(total, per_node)
        self._seen: dict[str, array[int]] = {}
        self._count = 0
        self.generation = 0  # advances each time the counts start over

    def admit(self, node: str, entry: bytes) -> bool:
        seen = self._seen.get(node)
        if seen is None:
            seen = self._seen[node] = array("q")
        h = hash(entry)
        i = bisect.bisect_left(seen, h)
        if i < len(seen) and seen[i] == h:
            return True
        if len(seen) >= self.per_node:
            return False
        if self._count >= self._total:
            self._seen = {node: (seen := array("q"))}
            self._count = 0
            self.generation += 1
            i = 0
        seen.insert(i, h)
        self._count += 1
        return True
