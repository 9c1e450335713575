"""Per-process series (opt-in, ``--processes.series``): memory and SM utilization of each GPU process.

Only the top ``--processes.series-max`` processes of each GPU or MIG instance by memory are served (ties
by PID, so the same ones from one sample to the next); the rest are counted in
``gpu_exporter_process_series_cut`` (processes left out of the newest sample). Each series carries ``pid``, ``process_name`` (the kernel's
``comm``, 15 characters at most) and, where pod attribution names the process's container, its
``namespace``, ``pod``, ``container`` and ``pod_uid`` (empty for a host process). At most
(GPUs + MIG instances) x N x 2 series: 8 GPUs at the default 10 give 160.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpu_exporter import hostread
from gpu_exporter.k8s.metrics import process_cut_gauge
from gpu_exporter.k8s.model import PodRef
from gpu_exporter.k8s.render import PodSeries, render
from gpu_exporter.limits import bound_value
from gpu_exporter.model import ProcessUsage, Sample

__all__ = ["PROCESS_FAMILIES", "ProcessNames", "ProcessSeries", "process_series", "top_processes"]

PROCESS_FAMILIES = ("gpu_process_memory_used_bytes", "gpu_process_utilization_ratio")
# (pod, pod uid, extra pod labels) of a PID, or None for a host process
PodOf = Callable[[int], "tuple[PodRef, str, tuple[tuple[str, str], ...]] | None"]


def top_processes(processes: Iterable[ProcessUsage], n: int) -> tuple[list[ProcessUsage], int]:
    """The ``n`` processes using the most memory (unknown memory last; ties by PID), and how many more."""
    ranked = sorted(processes, key=lambda p: (-(p.memory_bytes if p.memory_bytes is not None else -1.0), p.pid))
    return ranked[:n], max(0, len(ranked) - n)


class ProcessNames:
    """``/proc/<pid>/comm``, read once per process and forgotten when it exits."""

    def __init__(self, procfs: str | Path) -> None:
        self._procfs = Path(procfs)
        self._names: dict[int, str] = {}

    def get(self, pid: int) -> str:
        name = self._names.get(pid)
        if name is None:
            try:
                name = hostread.read_text(self._procfs / str(pid) / "comm", cap=64).strip()
            except OSError:
                name = ""  # gone, or another PID namespace: the series still has its PID
            self._names[pid] = name
        return name

    def retain(self, live: set[int]) -> None:
        for pid in [p for p in self._names if p not in live]:
            del self._names[pid]


def process_series(
    sample: Sample, n: int, names: ProcessNames, pod_of: PodOf | None = None
) -> tuple[list[PodSeries], int]:
    """The per-process series of one sample, and how many processes were left out by the cap."""
    memory: list[PodSeries] = []
    util: list[PodSeries] = []
    cut = 0
    live: set[int] = set()
    for device in sample.devices:
        kept, more = top_processes(device.processes, n)
        cut += more
        live.update(p.pid for p in device.processes)
        for process in kept:
            labels = device.device.labels() + _process_labels(process.pid, names, pod_of)
            if process.memory_bytes is not None:
                memory.append((PROCESS_FAMILIES[0], labels, process.memory_bytes))
            if process.sm_ratio is not None:
                util.append((PROCESS_FAMILIES[1], labels, process.sm_ratio))
    names.retain(live)
    return memory + util, cut


def _process_labels(pid: int, names: ProcessNames, pod_of: PodOf | None) -> tuple[tuple[str, str], ...]:
    found = pod_of(pid) if pod_of is not None else None
    pod, uid, extra = found if found is not None else (PodRef("", ""), "", ())
    return (("pid", str(pid)), ("process_name", bound_value(names.get(pid))), *pod.labels(), ("pod_uid", uid), *extra)


class ProcessSeries:
    """The per-process section of the page when pod attribution is off: rebuilt at each sample (a
    listener of the sampler), served as text. With pod attribution on, the attributor renders it."""

    def __init__(self, procfs: str, n: int, registry: CollectorRegistry | None = None) -> None:
        self._n = n
        self._names = ProcessNames(procfs)
        self._lock = threading.Lock()
        self._text = ""
        self.cut = process_cut_gauge(registry) if registry is not None else None

    def update(self, sample: Sample) -> None:
        series, cut = process_series(sample, self._n, self._names)
        text = render(series, PROCESS_FAMILIES)
        if self.cut is not None:
            self.cut.set(cut)
        with self._lock:
            self._text = text

    def text(self) -> str:
        with self._lock:
            return self._text
