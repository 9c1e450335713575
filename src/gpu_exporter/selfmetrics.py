"""Metrics about the process itself, as every Prometheus exporter serves them: ``process_*`` (CPU seconds,
resident and virtual memory, open and maximum file descriptors, start time; read from /proc/self at
render time, Linux only) and ``<name>_build_info``; ``Declare``, with which each component (the
forwarder, the bridge) declares its own ``gpu_exporter_*`` metrics; and ``Served``, a registry as the
pages serve it."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpu_exporter.buildinfo import build_info_family

__all__ = ["BuildInfoCollector", "Declare", "Served", "register"]

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


_CREATED_BY = ("counter", "histogram", "summary")


class Served(Collector):
    """``registry``'s families without the ``<name>_created`` samples prometheus_client adds to each
    counter, histogram and summary declared through it.

    The families the agent and the bridge build themselves carry none, so the pages had them for some
    counters only, by accident of which helper declared the counter; in the text format each one is a
    gauge family of its own (a series per label set in every TSDB that scrapes the page), and the agent's
    OpenMetrics page, made from its text page, then named ``<name>_created`` twice: a strict OpenMetrics
    parser refuses that ("Clashing name"). A restart shows in ``process_start_time_seconds``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if family.type in _CREATED_BY:
                created = family.name + "_created"
                kept = [s for s in family.samples if s.name != created]
                if len(kept) != len(family.samples):
                    family = copy.copy(family)
                    family.samples = kept
            yield family
