"""Metrics about the process itself, as every Prometheus exporter serves them: ``process_*`` (CPU seconds,
resident and virtual memory, open and maximum file descriptors, start time; read from /proc/self at
render time, Linux only) and ``<name>_build_info``; and ``Declare``, with which each component (the
forwarder, the bridge) declares its own ``gpu_exporter_*`` metrics."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import Metric

from gpu_exporter.buildinfo import build_info_family

__all__ = ["BuildInfoCollector", "Declare", "register"]

_Labelled = TypeVar("_Labelled", Counter, Gauge)


class BuildInfoCollector:
    def __init__(self, name: str, what: str) -> None:
        self.name = name
        self.what = what

    def collect(self) -> Iterator[Metric]:
        yield build_info_family(self.name, self.what)


def register(registry: CollectorRegistry, build_info_name: str | None = None, what: str = "") -> None:
    """Add ``process_*`` (and, when named, a build_info family) to ``registry``."""
    ProcessCollector(registry=registry)
    if build_info_name:
        registry.register(BuildInfoCollector(build_info_name, what))


class Declare:
    """Declares one component's own metrics in ``registry``, each name under ``prefix``
    (``gpu_exporter_forward_``). ``known`` label values get their series at once, so that they read 0
    before the first event instead of being absent."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.registry = registry
        self.prefix = prefix

    def counter(self, name: str, help_: str, labels: Sequence[str] = (), known: Iterable[str] = ()) -> Counter:
        return _with(Counter(self.prefix + name, help_, labels, registry=self.registry), known)

    def gauge(self, name: str, help_: str, labels: Sequence[str] = (), known: Iterable[str] = ()) -> Gauge:
        return _with(Gauge(self.prefix + name, help_, labels, registry=self.registry), known)

    def histogram(self, name: str, help_: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(self.prefix + name, help_, registry=self.registry, buckets=buckets)


def _with(metric: _Labelled, known: Iterable[str]) -> _Labelled:
    for value in known:
        metric.labels(value)
    return metric
