"""NVIDIA GPUs through NVML (``nvidia-ml-py``).

One handle per device, read once per interval by the sampler thread. A call the device does not
support is remembered and never made again; a function the driver lacks is logged once; a lost GPU
is reported ``up=False`` and retried with exponential backoff while the other GPUs go on being read.
XID errors arrive on a thread of their own that waits on NVML events.

The library module is a constructor argument: production passes ``pynvml``, the simulated backend
passes ``backends.fake.backend.SimNvml``, and tests pass a simulator with faults injected.
What is kept per device is in ``devices``; the readings that take several calls are in ``groups``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from gpu_exporter.backends import simple
from gpu_exporter.backends._calls import Backoff, CallGuard, Fault, Lost
from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.health import HealthTracker
from gpu_exporter.backends.nvidia import groups
from gpu_exporter.backends.nvidia.devices import (
    CLOCKS,
    FI_MEMORY_TEMP,
    FI_NVLINK_LINK_COUNT,
    FI_NVLINK_RX,
    FI_NVLINK_TX,
    MIG_PROFILE,
    Device,
    Mig,
    text,
)
from gpu_exporter.backends.nvidia.integrated import is_integrated
from gpu_exporter.backends.nvidia.library import classify, import_pynvml, init_message
from gpu_exporter.backends.nvidia.slow import SlowCalls
from gpu_exporter.backends.nvidia.violation import read_violations
from gpu_exporter.backends.nvidia.xid import XidEvents
from gpu_exporter.backends.simple import Simple
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, SeriesKey

__all__ = ["CRITICAL_XIDS", "NvmlBackend", "create"]

log = logging.getLogger("gpu_exporter.backends.nvml")  # the name its log lines have always had

Late = tuple[tuple[Simple, ...], Callable[[], Any]]  # a simple call still running: its rows, how to take its answer

# XIDs that mean a GPU needs attention; their counters exist from the start at 0 so that the first
# occurrence is an increase that alerts can see.
CRITICAL_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)
# seconds between listings of a GPU's MIG devices: a DRA driver creates one when it prepares a claim
# (dynamic MIG) and removes it after; a listing is one NVML call per slot (7 on an A100 or H100)
MIG_RESCAN = 10.0

# bit of nvmlDeviceGetCurrentClocksEventReasons -> reason label
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
)

# the series key of each reason, made once (a reason's key is the same every cycle)
_REASON_KEYS = tuple((bit, ("clock_event_reason", (reason,))) for bit, reason in CLOCK_EVENT_REASONS)
_NVLINK_KEYS = {FI_NVLINK_TX: "nvlink_tx", FI_NVLINK_RX: "nvlink_rx"}


@functools.lru_cache(maxsize=1024)
def _xid_key(xid: int) -> SeriesKey:
    return ("xid_errors", (str(xid),))


@functools.lru_cache(maxsize=64)
def _nvlink_fields(links: int) -> tuple[list[tuple[int, int]], dict[tuple[int, int], SeriesKey]]:
    """The field ids to ask for a GPU's ``links`` NVLinks, and each answer's series key."""
    ids = [(fid, link) for link in range(links) for fid in (FI_NVLINK_TX, FI_NVLINK_RX)]
    return ids, {(fid, link): (_NVLINK_KEYS[fid], (str(link),)) for fid, link in ids}


# One-value NVML calls (backends/simple.py), by catalog group: the catalog key, the NVML function, its
# arguments after the device handle, the scale to the catalog's base unit. Reads that take more than
# that live in groups.py.
SIMPLE_CALLS = simple.by_group(
    Simple("utilization", "nvmlDeviceGetUtilizationRates", field="gpu", divide=100),  # %
    Simple("memory_utilization", "nvmlDeviceGetUtilizationRates", field="memory", divide=100),
    Simple("temp_gpu", "nvmlDeviceGetTemperature", (0,)),  # NVML_TEMPERATURE_GPU, °C
    Simple("power", "nvmlDeviceGetPowerUsage", scale=1e-3),  # mW
    Simple("power_limit", "nvmlDeviceGetEnforcedPowerLimit", scale=1e-3),  # mW
    Simple("energy", "nvmlDeviceGetTotalEnergyConsumption", scale=1e-3),  # mJ
    *(Simple(f"clock_{clock}", "nvmlDeviceGetClockInfo", (clock_id,), scale=1e6) for clock, clock_id in CLOCKS),
    Simple("performance_state", "nvmlDeviceGetPerformanceState", low=0, high=15),  # P0-P15; 32 is unknown
    Simple("fan_speed", "nvmlDeviceGetFanSpeed", divide=100),  # %
    Simple("pcie_tx", "nvmlDeviceGetPcieThroughput", (0,), scale=1024.0),  # NVML_PCIE_UTIL_TX_BYTES, in KB/s
    Simple("pcie_rx", "nvmlDeviceGetPcieThroughput", (1,), scale=1024.0),  # NVML_PCIE_UTIL_RX_BYTES
    Simple("pcie_replay", "nvmlDeviceGetPcieReplayCounter"),
    Simple("pcie_link_generation", "nvmlDeviceGetCurrPcieLinkGeneration"),
    Simple("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth"),
)


class NvmlBackend:
    """Reads every NVIDIA GPU (and MIG instance) the library reports."""

    name = "nvidia"

    def __init__(
        self,
        config: Config,
        nvml: Any = None,
        *,
        retry_initial: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        xid_wait_ms: int = 500,
        slow_call_budget: float | None = 0.005,
        slow_call_timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._config = config
        self._nv: Any = nvml
        self._xid_wait_ms = xid_wait_ms  # how long one XID event wait blocks; bounds the time close() takes
        self._calls = CallGuard(
            log, self._classify, "%s is not in this NVIDIA driver; its metrics are skipped", missing_level=logging.INFO
        )
        self.errors = self._calls.errors
        self._backoff = Backoff(log, retry_initial, clock)
        self._clock = clock
        self._devices: list[Device] = []
        self._driver = ""
        self._cuda = ""
        self._xid = XidEvents(nvml, self.errors, xid_wait_ms)
        self._slow = SlowCalls(slow_call_budget, slow_call_timer)  # budget None: every call in line
        self._reading = False  # only calls of the reading phase are timed
        self._late: list[Late] = []  # values whose call is still running
        self._health = HealthTracker()
        self._opened = False

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        if self._nv is None:
            self._nv = import_pynvml()
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise BackendError(init_message(nv, exc)) from None
        self._opened = True
        try:
            count = int(nv.nvmlDeviceGetCount())
            self._driver = text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as exc:
            self.close()
            raise BackendError(f"NVML cannot list devices: {exc}") from None
        if count == 0:
            self.close()
            raise NoDevicesError("NVML reports no NVIDIA GPU on this machine")
        try:
            cuda = int(nv.nvmlSystemGetCudaDriverVersion())
            self._cuda = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except nv.NVMLError:
            self._cuda = ""
        integrated: list[str] = []
        for index in range(count):
            device = Device(index=index, id=DeviceId(str(index), ""))
            try:
                self._attach(device)
                device.live.up = True
            except Lost:
                self._backoff.lost(device, "at start")
            name = device.info.get("name", "")
            if is_integrated(name):  # a Jetson's GPU: the Jetson backend reads it, rails and sensors too
                integrated.append(f"{index} ({name})")
                for sample in device.gpm_samples:
                    self._try(device, "nvmlGpmSampleFree", sample)
                continue
            self._devices.append(device)
        if integrated:
            log.info("NVML device %s is a Jetson's integrated GPU: left to the jetson backend", ", ".join(integrated))
        if not self._devices:
            self.close()
            raise NoDevicesError(
                f"NVML lists only a Jetson's integrated GPU ({', '.join(integrated)}), which the jetson backend "
                "reads with its rails and sensors: run with --gpu-vendor=jetson or auto"
            )
        log.info(
            "NVML %s: %d GPU(s), driver %s, CUDA %s",
            getattr(nv, "__name__", "library"),
            len(self._devices),
            self._driver,
            self._cuda or "unknown",
        )
        if self._config.collector_enabled("xid"):
            self._xid = XidEvents(nv, self.errors, self._xid_wait_ms)
            self._xid.start((d.index, d.handle) for d in self._devices if d.handle is not None)

    def close(self) -> None:
        self._xid.stop()
        self._slow.close()
        if self._opened:
            for device in self._devices:
                for sample in device.gpm_samples:
                    self._try(device, "nvmlGpmSampleFree", sample)
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass
            self._opened = False

    def healthy(self) -> bool:
        return self._opened and any(d.live.up for d in self._devices)

    @property
    def xid_events_running(self) -> bool:
        """Whether XID events are being waited for (tools/validate_nvml.py)."""
        return self._xid.running

    @property
    def slow_calls(self) -> SlowCalls:
        """The calls measured slow and started early (for tests, the bench and tools/validate_nvml.py)."""
        return self._slow

    # -- calls -----------------------------------------------------------------------------------

    def _call(
        self, device: Device | Mig, name: str, *args: Any, label: str = "", variant: str = "", **kwargs: Any
    ) -> Any:
        """Call ``nvml.<name>``; None when the value is unavailable. Raises Lost.

        ``label`` names the call in error counts and caches when one function has two variants;
        ``variant`` tells apart uses of one function whose support differs per device. While reading,
        a call is timed; one slower than the budget is started early in later cycles (nvidia/slow.py).
        """
        fn = getattr(self._nv, name)
        named = label or name
        scope = device.scope
        slow = self._slow
        if not self._reading or slow.budget is None:
            return self._calls.call(scope, named, fn, *args, variant=variant, **kwargs)
        early = slow.take(scope, f"{named}:{variant}", args, kwargs, device.handle) if slow.pending else None
        started = slow.timer()
        answered = False
        try:
            if early is not None:
                result = self._calls.call(scope, named, lambda *_a, **_k: early.result(), variant=variant)
            else:
                result = self._calls.call(scope, named, fn, *args, variant=variant, **kwargs)
            answered = result is not None
            return result
        finally:
            seconds = slow.timer() - started
            if seconds > slow.budget or (not answered and slow.remembered):
                slow.observe(scope, f"{named}:{variant}", fn, args, kwargs, device.handle, seconds, answered)

    def _simple(self, device: Device, v: dict[SeriesKey, float], group: str) -> None:
        """The one-value calls of ``group`` (SIMPLE_CALLS), in order. A call started early and still
        running is answered at the end of the cycle (``_finish``), so the calls after it are not held up."""
        slow = self._slow
        rows = SIMPLE_CALLS.get(group, ())

        def fetch(row: Simple) -> Any:
            args = (device.handle, *row.args)
            if (
                self._reading
                and slow.pending
                and slow.running(device.scope, f"{row.call}:{row.variant}", args, device.handle)
            ):
                sharing = tuple(r for r in rows if r.ident == row.ident)  # every row that reads this answer
                self._late.append((sharing, lambda: self._call(device, row.call, *args, variant=row.variant)))
                return None
            return self._call(device, row.call, *args, variant=row.variant)

        simple.read(rows, fetch, v, self.errors)

    def _classify(self, exc: Exception) -> Fault | None:
        return classify(self._nv, exc)

    def _try(self, device: Device, name: str, *args: Any) -> Any:
        """Like _call, for paths where a lost device is not news (cleanup, discovery extras)."""
        try:
            return self._call(device, name, *args)
        except Lost:
            return None

    # -- discovery -------------------------------------------------------------------------------

    def _attach(self, device: Device) -> None:
        """Get the handle and everything that does not change while the driver stays loaded."""
        nv = self._nv
        index = device.index
        handle = self._call(device, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            raise Lost("no handle")
        device.handle = handle
        uuid = text(self._call(device, "nvmlDeviceGetUUID", handle) or "")
        if not uuid:
            raise Lost("no UUID")
        device.id = DeviceId(str(index), uuid)
        pci = self._call(device, "nvmlDeviceGetPciInfo", handle)
        minor = self._call(device, "nvmlDeviceGetMinorNumber", handle)
        info = {
            "name": text(self._call(device, "nvmlDeviceGetName", handle) or ""),
            "serial": text(self._call(device, "nvmlDeviceGetSerial", handle) or ""),
            "pci_bus_id": text(pci.busId) if pci is not None else "",
            "device": f"nvidia{minor}" if minor is not None else "",
            "driver_version": self._driver,
            "cuda_version": self._cuda,
            "vendor": "nvidia",
        }
        device.info = {k: v for k, v in info.items() if v}
        device.static = {}
        if self._config.collector_enabled("clocks"):
            for clock, clock_id in CLOCKS:
                mhz = self._call(device, "nvmlDeviceGetMaxClockInfo", handle, clock_id)
                if mhz:
                    device.static[(f"clock_max_{clock}", ())] = mhz * 1e6
        if self._config.collector_enabled("nvlink"):
            values = groups.field_values(self._call, device, [FI_NVLINK_LINK_COUNT])
            device.nvlinks = int(values.get((FI_NVLINK_LINK_COUNT, 0), 0))
        if self._config.collector_enabled("gpm") and not device.gpm_samples:
            support = self._call(device, "nvmlGpmQueryDeviceSupport", handle)
            if support is not None and support.isSupportedDevice:
                first = self._call(device, "nvmlGpmSampleAlloc")
                second = self._call(device, "nvmlGpmSampleAlloc")
                if first is not None and second is not None:
                    device.gpm_samples = [first, second]
                    device.gpm = True
        device.gpm_primed = False
        device.migs = self._discover_migs(device) if nv is not None else []
        device.migs_at = self._clock()

    def _discover_migs(self, device: Device) -> list[Mig]:
        if not self._config.collector_enabled("mig"):
            return []
        mode = self._call(device, "nvmlDeviceGetMigMode", device.handle)
        if not mode or int(mode[0]) != 1:
            return []
        slots = int(self._call(device, "nvmlDeviceGetMaxMigDeviceCount", device.handle) or 0)
        migs: list[Mig] = []
        for slot in range(slots):
            try:
                handle = self._nv.nvmlDeviceGetMigDeviceHandleByIndex(device.handle, slot)
            except self._nv.NVMLError:
                continue  # empty slot
            uuid = text(self._try(device, "nvmlDeviceGetUUID", handle) or "")
            gi = self._try(device, "nvmlDeviceGetGpuInstanceId", handle)
            ci = self._try(device, "nvmlDeviceGetComputeInstanceId", handle)
            name = text(self._try(device, "nvmlDeviceGetName", handle) or "")
            match = MIG_PROFILE.search(name)
            mig_id = DeviceId(
                gpu=device.id.gpu,
                uuid=uuid,
                gpu_instance=str(gi if gi is not None else ""),
                compute_instance=str(ci if ci is not None else ""),
                mig_profile=match.group(1) if match else "",
                parent_uuid=device.id.uuid,
            )
            migs.append(Mig(handle, mig_id, f"{device.index}/mig{slot}"))
        return migs

    # -- reading ---------------------------------------------------------------------------------

    def read(self) -> list[DeviceSample]:
        out: list[DeviceSample] = []
        now = self._clock()
        up = {d.scope for d in self._devices if d.live.up}
        self._slow.begin(lambda scope: str(scope).split("/")[0] in up)
        firsts: list[tuple[int, Device, list[Late]]] = []
        try:
            for device in self._devices:
                self._late = []
                samples = self._backoff.poll(device, now, self._attach, self._read_device)
                if samples is not None:
                    firsts.append((len(out), device, self._late))
                out.extend(samples if samples is not None else [DeviceSample(device.id, False, info=device.info)])
            for position, device, late in firsts:  # the calls still running, then the health summary
                out[position] = self._finish(device, out[position], late)
        finally:
            self._late = []
            self._slow.end()
        return out

    def _finish(self, device: Device, sample: DeviceSample, late: list[Late]) -> DeviceSample:
        if not late:  # complete already, health included
            return sample
        values = dict(sample.values.items())
        self._reading = True
        try:
            for rows, take in late:
                answer = take()
                for row in rows:
                    if simple.put(row, answer, values, self.errors, simple.number):
                        break  # a wrong-shaped answer is counted once
        except Lost as exc:
            self._backoff.lost(device, str(exc))
            return DeviceSample(device.id, False, info=device.info)
        finally:
            self._reading = False
        if self._config.collector_enabled("health"):
            values.update(self._health.evaluate(device.index, values, self._clock()))
        return dataclasses.replace(sample, values=values)

    def _read_device(self, device: Device) -> list[DeviceSample]:
        self._reading = True
        try:
            return self._read_device_values(device)
        finally:
            self._reading = False

    def _read_device_values(self, device: Device) -> list[DeviceSample]:
        enabled = self._config.collector_enabled
        h = device.handle
        v: dict[SeriesKey, float] = dict(device.static)
        call = self._call

        if enabled("utilization"):
            self._simple(device, v, "utilization")
            for key, name in (
                ("encoder_utilization", "nvmlDeviceGetEncoderUtilization"),
                ("decoder_utilization", "nvmlDeviceGetDecoderUtilization"),
            ):
                codec = call(device, name, h)
                if codec is not None:
                    v[(key, ())] = codec[0] / 100.0
        if enabled("memory"):
            groups.memory(self._call, self._nv, device, h, v)
        if enabled("temperature"):
            self._simple(device, v, "temperature")
            fields = groups.field_values(self._call, device, [FI_MEMORY_TEMP])
            if (FI_MEMORY_TEMP, 0) in fields:
                v[("temp_memory", ())] = fields[(FI_MEMORY_TEMP, 0)]
        if enabled("power"):
            self._simple(device, v, "power")
        if enabled("clocks"):
            self._simple(device, v, "clocks")
            reasons = call(device, "nvmlDeviceGetCurrentClocksEventReasons", h)
            if reasons is not None:
                for bit, reason_key in _REASON_KEYS:
                    v[reason_key] = 1.0 if reasons & bit else 0.0
            read_violations(lambda name, *args, **kw: call(device, name, *args, **kw), h, v)
        if enabled("fan"):
            self._simple(device, v, "fan")
        if enabled("pcie"):
            self._simple(device, v, "pcie")
        if enabled("ecc"):
            groups.ecc(self._call, device, h, v)
        if enabled("nvlink") and device.nvlinks:
            ids, keys = _nvlink_fields(device.nvlinks)
            for field_id, value in groups.field_values(self._call, device, ids).items():
                v[keys[field_id]] = value * 1024.0
        processes: tuple[ProcessUsage, ...] = ()
        if enabled("processes"):
            processes = groups.processes(self._call, self._calls.is_missing, device, h, v)
        if enabled("gpm") and device.gpm:
            groups.gpm(self._call, self._nv, device, v)
        if enabled("xid"):
            counts, last = self._xid.read(device.index)
            for xid in CRITICAL_XIDS:
                counts.setdefault(xid, 0)
            for xid, n in counts.items():
                v[_xid_key(xid)] = float(n)
            v[("xid_last", ())] = float(last)
        if enabled("health") and not self._late:  # else once the late values are in (_finish)
            v.update(self._health.evaluate(device.index, v, self._clock()))

        out = [DeviceSample(device.id, True, v, device.info, processes)]
        if self._clock() - device.migs_at >= MIG_RESCAN:  # MIG devices made or removed since (dynamic MIG)
            device.migs = self._discover_migs(device)
            device.migs_at = self._clock()
        for mig in device.migs:
            out.append(self._read_mig(device, mig))
        return out

    def _read_mig(self, device: Device, mig: Mig) -> DeviceSample:
        v: dict[SeriesKey, float] = {}
        processes: tuple[ProcessUsage, ...] = ()
        if self._config.collector_enabled("memory"):
            groups.memory(self._call, self._nv, mig, mig.handle, v)
        if self._config.collector_enabled("processes"):
            processes = groups.processes(self._call, self._calls.is_missing, mig, mig.handle, v)
        return DeviceSample(mig.id, True, v, device.info, processes)


def create(config: Config) -> NvmlBackend:
    return NvmlBackend(config)
