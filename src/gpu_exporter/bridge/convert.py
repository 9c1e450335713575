"""Decoded batches to remote-write series: catalog names, device labels, and the node label.

A health report (payload/health.py) becomes the agent's own series under the names of its page, with
``node`` added (``_health``): one dashboard panel and one alert serve scraped and bridged nodes alike.

Each value becomes a sample of the series ``<catalog name>{<device labels>, <constant labels>,
<dynamic labels>, node="<node>"}`` at the sample's original timestamp, so that the cloud sees the same
series the node's /metrics page shows, plus ``node``. Each device present in a sample also yields
``gpu_up`` (1 or 0) and, when it has identity strings, ``gpu_info{...} 1``, as on the /metrics page
(exposition.native_view).

A series' labels are composed per batch from a recipe shared by the whole fleet and the device's own
label fields (``_Device``), not cached per series: memory per node stays small and the cost of a
sample does not grow with the number of nodes. Series that have a value in every sample of a batch
share one timestamp list, which lets the encoder pack them with one plan (see
remote_write.WriteEncoder).
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.bridge import labels
from gpu_exporter.bridge.limits import SeriesBudget
from gpu_exporter.bridge.remote_write import Series, encode_labels
from gpu_exporter.bridge.values import COUNTER_KEYS, Counters, drop_nonfinite
from gpu_exporter.model import DeviceId, SeriesKey
from gpu_exporter.payload.columns import ColumnBatch
from gpu_exporter.payload.types import HealthValue

__all__ = ["INFO_METRIC", "UP_METRIC", "Converted", "Converter"]

UP_METRIC = catalog.UP.name
INFO_METRIC = catalog.INFO.name


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


# A plan (the recipe of each metric of a batch) is kept for the next batch only for a metrics list up to
# this long (a device has some 90 series, a MIG node's with pods a few thousand): a longer one, a node
# inventing series, would keep every series it named alive through the plan.
PLAN_LIMIT = 4096
# Bounds of what the fleet shares (a normal fleet uses ~100 recipes and a few plans of ~100 keys): a node
# that floods series with new label values churns these caches, it cannot grow them.
MAX_RECIPES = 20_000
MAX_PLANS_KEYS = 200_000  # series keys in all shared plans together

# A recipe: the Label fields of a series in order, each part either fixed bytes (the metric's labels) or
# the index of a run of the device's own fields (``_Device.runs``).
_Recipe = tuple[bytes | int, ...]
_MISSING = object()


class _Plan:
    """The recipes of one metrics list for devices with one set of label names, shared by all of them,
    and where its counters are."""

    __slots__ = ("counter_keys", "counter_positions", "formats", "recipes", "unknown")

    def __init__(self, metrics: tuple[SeriesKey, ...], recipes: list[_Recipe | None], absent: tuple[bool, ...]) -> None:
        self.recipes = recipes
        # each recipe as a bytes format and the getter of its runs: an entry is ``fmt % get(runs)``
        self.formats = [None if r is None else _format(r) for r in recipes]
        self.unknown = {m[0] for m, r, a in zip(metrics, recipes, absent, strict=True) if r is None and not a}
        positions = [j for j, (m, r) in enumerate(zip(metrics, recipes, strict=True)) if r and m[0] in COUNTER_KEYS]
        self.counter_positions = positions
        self.counter_keys = tuple(metrics[j] for j in positions)


class _Entries:
    """One batch's entries on one device (composed from a plan), and where its written counters are."""

    __slots__ = ("counter_keys", "counter_positions", "entries", "limited", "unknown")

    def __init__(self, plan: _Plan, entries: list[_Entry | None], allowed: list[bool]) -> None:
        self.entries = entries
        self.unknown = plan.unknown
        self.limited = allowed.count(False)  # entries its node may not create
        if self.limited:
            self.entries = [e if ok else _LIMITED for e, ok in zip(entries, allowed, strict=True)]
            positions = [j for j in plan.counter_positions if allowed[j]]
            self.counter_positions = positions
            self.counter_keys = tuple(plan.counter_keys[i] for i, j in enumerate(plan.counter_positions) if allowed[j])
        else:
            self.counter_positions = plan.counter_positions
            self.counter_keys = plan.counter_keys


def _format(recipe: _Recipe) -> tuple[bytes, Callable[[list[bytes]], Any]]:
    fmt = b"".join(b"%b" if p.__class__ is int else p.replace(b"%", b"%%") for p in recipe)  # type: ignore[union-attr]
    slots = [p for p in recipe if p.__class__ is int]
    if not slots:
        return fmt, lambda runs: ()
    return fmt, operator.itemgetter(*slots)  # one slot: the run itself, which % takes alone


def _field(name: str, value: str) -> bytes:
    return encode_labels(((name, value),))


class _Device:
    """What the converter remembers about one device of one node: its own label fields, not its series.

    A series' encoded labels are the Label fields of all its labels sorted by name; those of the device
    (``gpu``, ``uuid``, MIG labels) and the node are this device's own, the others (``__name__``,
    constant and dynamic labels) the metric's, the same on every device. So an entry is composed per
    batch from a recipe shared by the whole fleet (``Converter._recipe``) and this device's label fields
    (``runs``): a join of a few byte strings, instead of a cache of ~370 bytes per series that a fleet
    larger than the cache rebuilt for every message.
    """

    __slots__ = ("allowed", "counters", "info", "metrics", "names", "plan", "runs", "up", "why")

    def __init__(self, names: tuple[str, ...], fields: tuple[bytes, ...]) -> None:
        self.names = names  # the device's label names and the node label, sorted
        k = len(fields)
        # runs[i * (k + 1) + j]: the Label fields of names[i:j] joined (what a recipe's slot refers to)
        self.runs = [b"".join(fields[i:j]) for i in range(k + 1) for j in range(k + 1)]
        self.up: _Entry | None = None
        self.info: dict[tuple[tuple[str, str], ...], _Entry] = {}
        # the metrics list ``plan`` was made for, and which of its columns were absent
        self.metrics: tuple[tuple[SeriesKey, ...], tuple[bool, ...]] | None = None
        self.plan: _Plan | None = None
        self.allowed: list[bool] = []  # per recipe of ``plan``: within the series limits
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
        self._recipes: dict[tuple[SeriesKey, tuple[str, ...]], _Recipe | None] = {}
        self._plans: dict[tuple[tuple[SeriesKey, ...], tuple[bool, ...], tuple[str, ...]], _Plan] = {}
        self._plan_keys = 0
        self.budget = budget or SeriesBudget(max_series_per_node, max_series)
        self._reserved = frozenset(("__name__", node_label, *(f.name for f in dataclasses.fields(DeviceId))))

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

    def _admit(self, node: str, entry: _Entry, cache: _Device) -> _Entry:
        """``entry``, or ``_LIMITED`` when it would be one series too many for ``node`` or the fleet."""
        if self.budget.admit(node, entry):
            return entry
        cache.why = self.budget.refused
        return _LIMITED

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
        if len(self._recipes) >= MAX_RECIPES:  # dynamic label values (XID codes) are many at worst
            self._recipes.clear()
        self._recipes[(sys.intern(key), dynamic), names] = recipe
        return recipe

    def _plan(self, cache: _Device, metrics: tuple[SeriesKey, ...], absent: tuple[bool, ...]) -> _Plan:
        """The shared plan of (metrics list, columns present, device label names)."""
        key = (metrics, absent, cache.names)
        plan = self._plans.get(key)
        if plan is None:
            names = cache.names
            plan = _Plan(
                metrics, [None if a else self._recipe(m, names) for m, a in zip(metrics, absent, strict=True)], absent
            )
            if len(metrics) <= PLAN_LIMIT:  # a flood of series is not kept for the next device
                self._plan_keys += len(metrics)
                if self._plan_keys > MAX_PLANS_KEYS:
                    self._plans.clear()
                    self._plan_keys = len(metrics)
                self._plans[key] = plan
        return plan

    def _entries(
        self,
        node: str,
        cache: _Device,
        metrics: tuple[SeriesKey, ...],
        columns: list[list[float | None] | None],
    ) -> _Entries:
        """The entry of each of a batch's metrics on one device (None where the device has no column),
        composed for this batch; the device's plan is looked up, and its series admitted, only when the
        metrics list or the set of columns present changes. Only series with a column count against the
        series limits."""
        absent = tuple(map(operator.is_, columns, itertools.repeat(None)))
        runs = cache.runs
        plan = cache.plan
        fresh = plan is None or cache.metrics != (metrics, absent)
        if fresh:
            plan = self._plan(cache, metrics, absent)
        assert plan is not None
        entries = [None if f is None else f[0] % f[1](runs) for f in plan.formats]
        if fresh:
            allowed = [e is None or bool(self._admit(node, e, cache)) for e in entries]
            if len(metrics) <= PLAN_LIMIT:
                cache.plan, cache.metrics = plan, (metrics, absent)
                cache.allowed = allowed if False in allowed else []  # kept only where something is refused
            else:
                cache.plan = cache.metrics = None
            return _Entries(plan, entries, allowed)
        return _Entries(plan, entries, cache.allowed)

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
            if batch.health:
                pieces += self._health(node, batch.health, times, out)
                continue
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
                plan = self._entries(node, cache, metrics, dev.columns)
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

    def _health(
        self, node: str, values: tuple[HealthValue, ...], stamps: list[int], out: Converted
    ) -> list[tuple[_Entry, list[int], list[float]]]:
        """A health report's values as the agent's page names them, with the node label. Only the agent's
        own names (``gpu_exporter_*``, ``process_*``) are written, never those the bridge serves about
        nodes (``gpu_exporter_node_*``, ``gpu_exporter_bridge_*``): a publisher cannot write GPU series or
        the bridge's view of it through a report. Empty label values are left out (Prometheus reads them as
        absent); a label named like the node label drops the value."""
        pieces = []
        for name, pairs, value in values:
            if not name.startswith(_HEALTH_PREFIXES) or name.startswith(_BRIDGE_PREFIXES):
                _add(out.dropped, (node, "health_name"), 1)
                continue
            if any(k == self.node_label for k, _ in pairs):
                _add(out.dropped, (node, "health_label"), 1)
                continue
            entry = _entry([("__name__", name), *((k, v) for k, v in pairs if v), (self.node_label, node)])
            if not self.budget.admit(node, entry):
                _add(out.limited, (node, self.budget.refused), 1)
                continue
            pieces.append((entry, stamps, [value]))
        return pieces

    def _screen(
        self,
        batch: ColumnBatch,
        plan: _Entries,
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


_HEALTH_PREFIXES = ("gpu_exporter_", "process_")
_BRIDGE_PREFIXES = ("gpu_exporter_node_", "gpu_exporter_bridge_")


def _add(counts: dict[tuple[str, str], int], key: tuple[str, str], n: int) -> None:
    counts[key] = counts.get(key, 0) + n
