"""Metrics about the process itself, as every Prometheus exporter serves them: ``process_*`` (CPU seconds,
resident and virtual memory, open and maximum file descriptors, start time; read from /proc/self at
render time, Linux only) and ``<name>_build_info``."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import Metric

from gpu_exporter.buildinfo import build_info_family

__all__ = ["BuildInfoCollector", "register"]


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
