"""The attribution thread: follows the ring, maps GPU processes to pods, keeps per-pod series ready.

Nothing here runs on the scrape path: the exposition appends ``text()``, a string rebuilt once per
sample. The kubelet's pod-resources API (when its socket exists) names the containers that hold each
GPU even while they run no process, by device plugin or by DRA claim (``holders.py``); the /proc
fallback names the containers whose processes the driver reports, which is all KubeEdge offers. Both
feed the same series; a pod whose processes exit and that the kubelet no longer lists disappears from
the page once the kubelet has been asked again. Every per-pod series carries ``pod_uid``: from the
process's cgroup path, else from the pod's log directory name.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from gpu_exporter.config import Config
from gpu_exporter.k8s import cgroup
from gpu_exporter.k8s.dra import ClaimResolver, minor_of
from gpu_exporter.k8s.energy import EnergyMeter
from gpu_exporter.k8s.holders import KubeletHolders
from gpu_exporter.k8s.metrics import AttributionMetrics
from gpu_exporter.k8s.model import PodRef, PodShare
from gpu_exporter.k8s.names import PodNames
from gpu_exporter.k8s.podlabels import PodLabelSource
from gpu_exporter.k8s.podresources import PodResources
from gpu_exporter.k8s.processes import ProcessNames, process_series
from gpu_exporter.k8s.render import KEYS, NAMES, PodSeries, render
from gpu_exporter.k8s.slices import ResourceSlices, api_url
from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey
from gpu_exporter.ring import RingBuffer

__all__ = ["DevicePods", "PodAttributor"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DevicePods:
    """The containers on each device in the newest sample, for views that label device series."""

    by_uuid: dict[str, tuple[PodRef, ...]]
    shares_by_uuid: dict[str, tuple[PodShare, ...]] = field(default_factory=dict)

    def get(self, uuid: str) -> tuple[PodRef, ...]:
        return self.by_uuid.get(uuid, ())

    def shares(self, uuid: str) -> tuple[PodShare, ...]:
        """Each container's part of the device: its UID, replica, memory and SM utilization."""
        return self.shares_by_uuid.get(uuid, ())


@dataclass
class _Usage:
    memory: float = 0.0
    memory_known: bool = False
    sm: float = 0.0
    sm_known: bool = False
    processes: int = 0


def _capped(usage: dict[PodRef, _Usage], held: set[PodRef], n: int) -> tuple[list[PodRef], int]:
    """The ``n`` containers of a device with the most memory, then SM, then holders by name (sorted by
    name, as always served), and how many more there were. 4,000 processes of as many pods on one GPU
    gave 16,000 per-pod series without the cap."""
    everyone = set(usage) | held

    def rank(pod: PodRef) -> tuple[float, float, PodRef]:
        used = usage.get(pod)
        return (-(used.memory if used else 0.0), -(used.sm if used else 0.0), pod)

    kept = sorted(everyone, key=rank)[:n]
    return sorted(kept), len(everyone) - len(kept)


class PodAttributor:
    def __init__(
        self,
        config: Config,
        ring: RingBuffer,
        registry: CollectorRegistry | None = None,
        *,
        lister: Callable[[str], PodResources] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._ring = ring
        self._meter = EnergyMeter(config.k8s_idle_power, max_gap=max(60.0, 10 * config.interval))
        self._pids: dict[int, cgroup.ContainerCgroup | None] = {}
        self._names = PodNames(config.k8s_pod_logs_path, config.k8s_refresh_interval, clock)
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, pod) -> uid, from this sample's cgroups
        self._seq = 0
        self.pods_cut = 0  # containers of the newest sample left off by k8s.max-pods-per-gpu
        self._lock = threading.Lock()
        self._text = ""
        self._values: dict[str, dict[SeriesKey, float]] = {}
        self._device_pods = DevicePods({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._metrics = AttributionMetrics(registry, bool(config.k8s_pod_labels), config.processes_series)
        slices = None
        if config.k8s_resource_slices:  # opt-in: the only source here that asks the API server
            slices = ResourceSlices(
                api_url(config.k8s_api_url),
                config.k8s_api_token_file,
                config.k8s_api_ca_file,
                config.node_name,
                config.k8s_refresh_interval,
                error=lambda: self._metrics.error("resource_slices"),
                clock=clock,
            )
        resolver = ClaimResolver(
            config.k8s_cdi_spec_dirs, config.path_procfs, config.k8s_refresh_interval, clock, slices
        )
        self._holders = KubeletHolders(
            config.k8s_kubelet_socket, config.k8s_refresh_interval, resolver, lister, self._metrics.error, clock
        )
        self._process_names = ProcessNames(config.path_procfs) if config.processes_series else None
        self._pod_labels: PodLabelSource | None = None
        if config.k8s_pod_labels:  # opt-in: without it, no pod label and no request
            self._pod_labels = PodLabelSource(
                config.k8s_pod_list_url,
                config.k8s_pod_labels,
                config.k8s_pod_labels_max,
                config.k8s_pod_label_max_length,
                config.k8s_refresh_interval,
                config.k8s_pod_list_token_file,
                config.k8s_pod_list_ca_file,
                count=self._metrics.labels_cut,
                error=lambda: self._metrics.error("pod_list"),
                clock=clock,
            )

    # --- public API ------------------------------------------------------------------------------

    def text(self) -> str:
        """The per-pod series for the newest sample (Prometheus text), for the exposition to append."""
        with self._lock:
            return self._text

    def device_values(self) -> dict[str, dict[SeriesKey, float]]:
        """The per-pod series of the newest sample as catalog values by device UUID, for the forwarder."""
        with self._lock:
            return self._values

    def device_pods(self) -> DevicePods:
        with self._lock:
            return self._device_pods

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("pod attribution already started")
        self._thread = threading.Thread(target=self._run, name="gpu-exporter-k8s", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def process(self, samples: Iterable[Sample]) -> None:
        """Account ``samples`` (oldest first) and rebuild the series from the last one."""
        samples = list(samples)
        if not samples:
            return
        self._holders.refresh()
        if self._pod_labels is not None:
            self._pod_labels.refresh()
        for sample in samples:
            self._seq = max(self._seq, sample.seq)
            series, device_pods = self._account(sample)
        processes: list[PodSeries] = []
        process_cut = 0
        if self._process_names is not None:  # opt-in; on the page only, never forwarded
            processes, process_cut = process_series(
                samples[-1], self._config.processes_series_max, self._process_names, self._pod_of_pid
            )
        values: dict[str, dict[SeriesKey, float]] = {}
        for name, labels, value in series:
            pairs = dict(labels)
            key = (KEYS[name], (pairs["namespace"], pairs["pod"], pairs["container"], pairs["pod_uid"]))
            values.setdefault(pairs["uuid"], {})[key] = value
        with self._lock:
            self._text = render(series + processes)
            self._values = values
            self._device_pods = device_pods
        self._metrics.sample(
            sum(1 for name, _, _ in series if name == NAMES["pod_info"]),
            self.pods_cut,
            self._holders.claim_devices(samples[-1].devices),
            process_cut,
        )

    # --- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._ring.wait_after(self._seq, timeout=0.5):
                samples, _missed = self._ring.since(self._seq)
                try:
                    self.process(samples)
                except Exception:  # never let one bad cycle end attribution
                    log.exception("pod attribution failed for this sample")
                    self._metrics.error("internal")

    # --- sources ---------------------------------------------------------------------------------

    def _uid(self, pod: PodRef) -> str:
        """The pod's UID: from a process's cgroup path, else from its log directory ("" if neither)."""
        return self._uids.get((pod.namespace, pod.pod)) or self._names.uid(pod)

    def _pod_of_pid(self, pid: int) -> tuple[PodRef, str, tuple[tuple[str, str], ...]] | None:
        """The pod of a process of the newest sample (already looked up), for the per-process series."""
        found = self._pids.get(pid)
        names = self._names.directory.names(found.pod_uid, found.container_id) if found else None
        if found is None or names is None:
            return None
        pod = PodRef(*names)
        extra = self._pod_labels.labels(pod.namespace, pod.pod, found.pod_uid) if self._pod_labels else ()
        return pod, found.pod_uid, extra

    def _pod_of(self, pid: int) -> PodRef | None:
        if pid not in self._pids:
            self._pids[pid] = cgroup.read_pid(self._config.path_procfs, pid)
        found = self._pids[pid]
        pod = self._names.name(found) if found else None
        if pod is not None and found is not None:
            self._uids[(pod.namespace, pod.pod)] = found.pod_uid
        return pod

    # --- one sample ------------------------------------------------------------------------------

    def _account(self, sample: Sample) -> tuple[list[PodSeries], DevicePods]:
        live_pids = {p.pid for d in sample.devices for p in d.processes}
        for pid in [p for p in self._pids if p not in live_pids]:
            del self._pids[pid]  # exited: its PID may be reused by another pod's process
        self._uids = {}  # learnt again from this sample's processes
        info: list[PodSeries] = []
        memory: list[PodSeries] = []
        util: list[PodSeries] = []
        energy: list[PodSeries] = []
        present: list[tuple[DeviceId, PodRef]] = []
        by_uuid: dict[str, tuple[PodRef, ...]] = {}
        shares: dict[str, tuple[PodShare, ...]] = {}
        cut = 0
        for device in sample.devices:
            usage = self._usage(device)
            held = self._holders.held(device, minor_of(device))
            pods, more = _capped(usage, held, self._config.k8s_max_pods_per_gpu)
            cut += more
            if not pods:
                continue
            by_uuid[device.device.uuid] = tuple(pods)
            replicas = self._holders.replicas(device)
            self._step_energy(sample.timestamp, device, usage)
            base = device.device.labels()
            device_shares: list[PodShare] = []
            for pod in pods:
                uid = self._uid(pod)
                used = usage.get(pod)
                device_shares.append(
                    PodShare(pod, uid, replicas.get(pod, ""), used.memory if used else 0.0, used.sm if used else 0.0)
                )
                labels = (*base, *pod.labels(), ("pod_uid", uid))
                if self._pod_labels is not None:
                    labels += self._pod_labels.labels(pod.namespace, pod.pod, uid)
                info.append((NAMES["pod_info"], labels, 1.0))
                present.append((device.device, pod))
                if used is not None and used.memory_known:
                    memory.append((NAMES["pod_memory"], labels, used.memory))
                if used is not None and used.sm_known:
                    util.append((NAMES["pod_utilization"], labels, used.sm))
                if self._meter.idle(device.device) is not None and ("power", ()) in device.values:
                    joules = self._meter.total(device.device, pod)
                    energy.append((NAMES["pod_energy"], labels, joules))
            shares[device.device.uuid] = tuple(device_shares)
        self._meter.retain(present)
        self.pods_cut = cut
        return info + memory + util + energy, DevicePods(by_uuid, shares)

    def _usage(self, device: DeviceSample) -> dict[PodRef, _Usage]:
        usage: dict[PodRef, _Usage] = {}
        for process in device.processes:
            pod = self._pod_of(process.pid)
            if pod is None:
                continue  # a host process, or a pod whose log directory is already gone
            entry = usage.setdefault(pod, _Usage())
            entry.processes += 1
            if process.memory_bytes is not None:
                entry.memory += process.memory_bytes
                entry.memory_known = True
            if process.sm_ratio is not None:
                entry.sm += process.sm_ratio
                entry.sm_known = True
        return usage

    def _step_energy(self, timestamp: float, device: DeviceSample, usage: dict[PodRef, _Usage]) -> None:
        power = device.values.get(("power", ()))
        joules = device.values.get(("energy", ()))
        if any(u.sm_known for u in usage.values()):
            weights = {pod: u.sm for pod, u in usage.items()}
        else:  # the driver reports no per-process utilization: split evenly by process
            weights = {pod: float(u.processes) for pod, u in usage.items()}
        self._meter.step(device.device, timestamp, power, joules, weights)
