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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpu_exporter import catalog
from gpu_exporter.bridge.remote_write import LabelSet, Series
from gpu_exporter.forward.batch import Batch
from gpu_exporter.model import DeviceId, Sample

__all__ = ["INFO_METRIC", "UP_METRIC", "Converted", "Converter"]

UP_METRIC = "gpu_up"
INFO_METRIC = "gpu_info"
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


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
        self._devices: dict[tuple[str, DeviceId], dict[object, LabelSet | None]] = {}
        self._cached = 0

    def _device_cache(self, node: str, device: DeviceId) -> dict[object, LabelSet | None]:
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
        cache: dict[object, LabelSet | None],
        series: tuple[str, tuple[str, ...]],
    ) -> LabelSet | None:
        """The label set of one catalog series on one device, None for an unknown key."""
        try:
            return cache[series]
        except KeyError:
            pass
        key, dynamic = series
        try:
            metric = catalog.by_key(key)
        except KeyError:
            labels: LabelSet | None = None
        else:
            pairs = [("__name__", metric.name), *device.labels(), *metric.const_labels]
            pairs += zip(metric.labels, dynamic, strict=False)
            pairs.append((self.node_label, node))
            labels = tuple(sorted(pairs))
        cache[series] = labels
        self._cached += 1
        return labels

    def convert(self, batches: Iterable[tuple[Batch, Sequence[Sample]]]) -> Converted:
        """Series for the given samples of each batch (the ones not written before)."""
        out = Converted()
        # label set -> parts (timestamp list, values), in the order the batches come
        parts: dict[LabelSet, list[tuple[list[int], list[float]]]] = {}
        ordered = sorted(((b, s) for b, s in batches if s), key=lambda bs: bs[1][0].timestamp)
        for batch, samples in ordered:
            node = batch.node
            n = len(samples)
            stamps = [round(s.timestamp * 1000) for s in samples]
            newest = max(stamps)
            if out.newest_ms is None or newest > out.newest_ms:
                out.newest_ms = newest
            columns: dict[LabelSet, tuple[list[int], list[float]]] = {}
            for i, sample in enumerate(samples):
                ts = stamps[i]
                for dev in sample.devices:
                    out.gpu_samples += 1
                    cache = self._device_cache(node, dev.device)
                    for labels, value in self._device_series(node, dev.device, dev.up, dev.info, cache):
                        col = columns.get(labels)
                        if col is None:
                            col = columns[labels] = ([], [])
                        col[0].append(ts)
                        col[1].append(value)
                    if not dev.up:  # like the /metrics page: a device that did not answer has no values
                        continue
                    for series, value in dev.values.items():
                        found = self._labels(node, dev.device, cache, series)
                        if found is None:
                            out.unknown_keys.add(series[0])
                            continue
                        col = columns.get(found)
                        if col is None:
                            col = columns[found] = ([], [])
                        col[0].append(ts)
                        col[1].append(value)
            for labels, (ts_list, values) in columns.items():
                # a full column shares the batch's timestamp list (one packing plan for all of them)
                parts.setdefault(labels, []).append((stamps if len(ts_list) == n else ts_list, values))
        joined: dict[tuple[int, ...], list[int]] = {}
        for labels, pieces in parts.items():
            if len(pieces) == 1:
                out.series.append(Series(labels, pieces[0][0], pieces[0][1]))
                continue
            ids = tuple(id(p[0]) for p in pieces)
            ts_all = joined.get(ids)
            if ts_all is None:
                ts_all = joined[ids] = [t for p in pieces for t in p[0]]
            values = [v for p in pieces for v in p[1]]
            if any(b <= a for a, b in itertools.pairwise(ts_all)):
                points = sorted(dict(zip(ts_all, values, strict=True)).items())
                out.series.append(Series(labels, [t for t, _ in points], [v for _, v in points]))
            else:
                out.series.append(Series(labels, ts_all, values))
        return out

    def _device_series(
        self,
        node: str,
        device: DeviceId,
        up: bool,
        info: dict[str, str],
        cache: dict[object, LabelSet | None],
    ) -> list[tuple[LabelSet, float]]:
        up_labels = cache.get(UP_METRIC)
        if up_labels is None:
            up_labels = cache[UP_METRIC] = tuple(
                sorted([("__name__", UP_METRIC), *device.labels(), (self.node_label, node)])
            )
        out = [(up_labels, 1.0 if up else 0.0)]
        if info:
            info_key = (INFO_METRIC, tuple(info.items()))
            info_labels = cache.get(info_key)
            if info_labels is None:
                pairs = dict(info_key[1])
                pairs.update(device.labels())
                pairs["__name__"] = INFO_METRIC
                pairs[self.node_label] = node
                info_labels = cache[info_key] = tuple(sorted((k, v) for k, v in pairs.items() if _LABEL_NAME.match(k)))
                self._cached += 1
            out.append((info_labels, 1.0))
        return out
