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

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpu_exporter import catalog
from gpu_exporter.bridge.columns import ColumnBatch
from gpu_exporter.bridge.remote_write import LabelSet, Series, encode_labels
from gpu_exporter.model import DeviceId

__all__ = ["INFO_METRIC", "UP_METRIC", "Converted", "Converter"]

UP_METRIC = "gpu_up"
INFO_METRIC = "gpu_info"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class _Entry:
    """A series' label set and its encoded Label fields; compared by identity, which is cheap."""

    __slots__ = ("block", "labels")

    def __init__(self, labels: LabelSet) -> None:
        self.labels = labels
        self.block = encode_labels(labels)


@dataclass
class Converted:
    series: list[Series] = field(default_factory=list)
    gpu_samples: int = 0  # (sample, device) pairs
    newest_ms: int | None = None
    unknown_keys: set[str] = field(default_factory=set)


class Converter:
    """Turns batches into series. Not thread-safe: one per writer thread."""

    def __init__(self, node_label: str = "node", cache_size: int = 500_000) -> None:
        if not _LABEL_NAME.match(node_label) or node_label.startswith("__"):
            raise ValueError(f"invalid node label name {node_label!r}")
        self.node_label = node_label
        self._cache_size = cache_size
        self._devices: dict[tuple[str, DeviceId], dict[object, _Entry | None]] = {}
        self._cached = 0

    def _device_cache(self, node: str, device: DeviceId) -> dict[object, _Entry | None]:
        key = (node, device)
        cache = self._devices.get(key)
        if cache is None:
            if self._cached >= self._cache_size:
                self._devices.clear()
                self._cached = 0
            cache = self._devices[key] = {}
        return cache

    def _labels(
        self,
        node: str,
        device: DeviceId,
        cache: dict[object, _Entry | None],
        series: tuple[str, tuple[str, ...]],
    ) -> _Entry | None:
        """The labels of one catalog series on one device, None for an unknown key."""
        try:
            return cache[series]
        except KeyError:
            pass
        key, dynamic = series
        try:
            metric = catalog.by_key(key)
        except KeyError:
            entry: _Entry | None = None
        else:
            pairs = [("__name__", metric.name), *device.labels(), *metric.const_labels]
            pairs += zip(metric.labels, dynamic, strict=False)
            pairs.append((self.node_label, node))
            entry = _Entry(tuple(sorted(pairs)))
        cache[series] = entry
        self._cached += 1
        return entry

    def convert(self, items: Iterable[tuple[ColumnBatch, list[int] | None]]) -> Converted:
        """Series for each batch's samples at the given positions (None: all of them)."""
        out = Converted()
        # label set -> parts (timestamp list, values), oldest batch first
        parts: dict[_Entry, list[tuple[list[int], list[float]]]] = {}

        def add(labels: _Entry, stamps: list[int], values: list[float]) -> None:
            found = parts.get(labels)
            if found is None:
                parts[labels] = [(stamps, values)]
            else:
                found.append((stamps, values))

        def first_time(item: tuple[ColumnBatch, list[int] | None]) -> int:
            batch, keep = item
            return batch.times_ms[keep[0] if keep else 0]

        for batch, keep in sorted((i for i in items if i[1] is None or i[1]), key=first_time):
            node = batch.node
            times = batch.times_ms if keep is None else [batch.times_ms[i] for i in keep]
            n = len(times)
            if out.newest_ms is None or times[-1] > out.newest_ms:
                out.newest_ms = max(times)
            for dev in batch.devices:
                cache = self._device_cache(node, dev.device)
                up = dev.up if keep is None else [dev.up[i] for i in keep]
                if None not in up and 0 not in up:  # the common case: present and answering throughout
                    present = answering = None
                    out.gpu_samples += n
                    stamps_up = stamps_ok = times
                    flags = [1.0] * n
                else:
                    present = [i for i, u in enumerate(up) if u is not None]
                    answering = [i for i in present if up[i]]
                    out.gpu_samples += len(present)
                    stamps_up = [times[i] for i in present]
                    stamps_ok = [times[i] for i in answering]
                    flags = [float(up[i]) for i in present]  # type: ignore[arg-type]
                if not stamps_up:
                    continue
                up_labels, info_labels = self._device_labels(node, dev.device, dev.info, cache)
                add(up_labels, stamps_up, flags)
                if info_labels is not None:
                    add(info_labels, stamps_up, [1.0] * len(stamps_up))
                if not stamps_ok:
                    continue  # like the /metrics page: a device that did not answer has no values
                for j, col in enumerate(dev.columns):
                    if col is None:
                        continue
                    labels = self._labels(node, dev.device, cache, batch.metrics[j])
                    if labels is None:
                        out.unknown_keys.add(batch.metrics[j][0])
                        continue
                    if keep is not None:
                        col = [col[i] for i in keep]
                    if answering is None and None not in col:
                        add(labels, times, col)  # type: ignore[arg-type]
                        continue
                    positions = range(n) if answering is None else answering
                    points = [(times[i], v) for i in positions if (v := col[i]) is not None]
                    if points:
                        add(labels, [t for t, _ in points], [v for _, v in points])
        joined: dict[tuple[int, ...], list[int]] = {}
        for entry, pieces in parts.items():
            names = entry.labels
            if len(pieces) == 1:
                out.series.append(Series(names, pieces[0][0], pieces[0][1], entry.block))
                continue
            ids = tuple(id(p[0]) for p in pieces)
            ts_all = joined.get(ids)
            if ts_all is None:
                ts_all = joined[ids] = [t for p in pieces for t in p[0]]
            values = [v for p in pieces for v in p[1]]
            if any(b <= a for a, b in itertools.pairwise(ts_all)):
                merged = sorted(dict(zip(ts_all, values, strict=True)).items())
                out.series.append(Series(names, [t for t, _ in merged], [v for _, v in merged], entry.block))
            else:
                out.series.append(Series(names, ts_all, values, entry.block))
        return out

    def _device_labels(
        self, node: str, device: DeviceId, info: dict[str, str], cache: dict[object, _Entry | None]
    ) -> tuple[_Entry, _Entry | None]:
        """The label sets of ``gpu_up`` and (with identity strings) ``gpu_info`` for one device."""
        up_labels = cache.get(UP_METRIC)
        if up_labels is None:
            up_labels = cache[UP_METRIC] = _Entry(
                tuple(sorted([("__name__", UP_METRIC), *device.labels(), (self.node_label, node)]))
            )
        if not info:
            return up_labels, None
        info_key = (INFO_METRIC, tuple(info.items()))
        info_labels = cache.get(info_key)
        if info_labels is None:
            pairs = dict(info_key[1])
            pairs.update(device.labels())
            pairs["__name__"] = INFO_METRIC
            pairs[self.node_label] = node
            info_labels = cache[info_key] = _Entry(
                tuple(sorted((k, v) for k, v in pairs.items() if _LABEL_NAME.match(k)))
            )
            self._cached += 1
        return up_labels, info_labels
