"""Simulated GPUs: a stand-in for the NVML library, read by the real NVML backend.

``--gpu-vendor=fake`` runs the exporter on this simulator, so the quick start, demos and benchmarks
exercise the same backend code as a real NVIDIA node. Values are plausible and vary with time
(a slow sine per GPU). Tests use the same simulator with faults injected: a call raising a given
``pynvml.NVMLError_*`` class, a function missing from the "driver", a GPU lost mid-run, XID events.

It raises the real error classes of ``pynvml`` so the backend handles exactly what it would in
production.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pynvml

from gpu_exporter.backends.fake_throttle import ThrottleSim
from gpu_exporter.backends.nvml import NvmlBackend
from gpu_exporter.config import Config

__all__ = ["SimNvml", "create"]

GIB = 1024**3
_MODEL = "NVIDIA H100 80GB HBM3"
_MIG_PROFILES = ("1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb")


class _Handle:
    __slots__ = ("index", "mig")

    def __init__(self, index: int, mig: int | None = None) -> None:
        self.index = index
        self.mig = mig

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Handle) and (self.index, self.mig) == (other.index, other.mig)

    def __hash__(self) -> int:
        return hash((self.index, self.mig))

    def __repr__(self) -> str:
        return f"<sim gpu {self.index}{'' if self.mig is None else f' mig {self.mig}'}>"


class _GpmRequest:
    """Mirror of ``c_nvmlGpmMetricsGet_t`` with plain attributes."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(32)]


class SimNvml(ThrottleSim):
    """Quacks like the ``pynvml`` module for the calls the NVML backend makes."""

    __name__ = "simulated"

    # constants and error classes come from the real module
    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = _GpmRequest

    def __init__(
        self,
        gpus: int = 2,
        mig: int = 0,
        seed: int = 0,
        clock: Callable[[], float] = time.time,
        processes_per_gpu: int = 1,
        throttle: Mapping[int, float] | None = None,
        call_cost: Mapping[str, float] | None = None,
    ) -> None:
        self.gpus = gpus
        self.mig = mig
        self.seed = seed
        self.clock = clock
        self.start = clock()
        self.processes_per_gpu = processes_per_gpu
        self.calls: Counter[str] = Counter()
        self.faults: dict[tuple[int | None, str], type[Exception]] = {}
        self.missing: set[str] = set()
        self.lost: set[int] = set()
        self.init_error: type[Exception] | None = None
        self.processes: dict[int, list[tuple[int, int | None, int]]] = {}
        self.remapped_rows: dict[int, tuple[int, int, int, int]] = {}  # GPU -> (corr, unc, pending, failure)
        self._events: queue.Queue[SimpleNamespace] = queue.Queue()
        self._lock = threading.Lock()
        self._init_throttle(throttle, call_cost)
        for name in dir(pynvml):
            if name.startswith("NVMLError_"):
                setattr(self, name, getattr(pynvml, name))

    # -- fault injection -------------------------------------------------------------------------

    def fail(self, index: int | None, call: str, error: type[Exception]) -> None:
        """Make ``call`` raise ``error`` for GPU ``index`` (None: every GPU)."""
        self.faults[(index, call)] = error

    def lose(self, index: int) -> None:
        self.lost.add(index)

    def recover(self, index: int) -> None:
        self.lost.discard(index)

    def xid(self, index: int, code: int) -> None:
        self._events.put(
            SimpleNamespace(
                device=_Handle(index), eventData=code, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF
            )
        )

    # -- plumbing --------------------------------------------------------------------------------

    def _enter(self, call: str, handle: Any = None) -> None:
        with self._lock:
            self.calls[call] += 1
        self._pay(call)
        if call in self.missing:
            raise pynvml.NVMLError_FunctionNotFound()
        index = handle.index if isinstance(handle, _Handle) else None
        if index is not None and index in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        error = self.faults.get((index, call)) or self.faults.get((None, call))
        if error is not None:
            raise error()

    def _wave(self, handle: _Handle, period: float, phase: float = 0.0) -> float:
        """0..1, smooth, different per GPU."""
        t = self.clock() - self.start
        return 0.5 + 0.5 * math.sin(t / period + handle.index * 1.7 + self.seed + phase)

    def _is_mig_parent(self, handle: _Handle) -> bool:
        return self.mig > 0 and handle.index == 0 and handle.mig is None

    def _not_on_mig(self, handle: _Handle) -> None:
        if handle.mig is not None or self._is_mig_parent(handle):
            raise pynvml.NVMLError_NotSupported()

    # -- library ---------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return self.gpus

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return 12040

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        handle = _Handle(index)
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        if not 0 <= index < self.gpus:
            raise pynvml.NVMLError_InvalidArgument()
        return handle

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", h)
        if h.mig is not None:
            return f"MIG-{self.seed:04x}{h.index:04x}-{h.mig:04x}-4000-8000-00000000a1{h.mig:02x}"
        return f"GPU-{self.seed:08x}-{h.index:04x}-4000-8000-0000000000{h.index:02x}"

    def nvmlDeviceGetName(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetName", h)
        if h.mig is not None:
            return f"{_MODEL} MIG {_MIG_PROFILES[h.mig]}"
        return _MODEL

    def nvmlDeviceGetSerial(self, h: _Handle) -> str:
        self._enter("nvmlDeviceGetSerial", h)
        return f"16523{self.seed:03d}{h.index:05d}"

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=f"00000000:{0x18 + h.index * 0x10:02X}:00.0".encode())

    def nvmlDeviceGetMinorNumber(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetMinorNumber", h)
        return h.index

    def nvmlDeviceGetMaxClockInfo(self, h: _Handle, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", h)
        return {0: 1980, 1: 1980, 2: 2619, 3: 1545}[clock]

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock: int) -> int:
        self._enter("nvmlDeviceGetClockInfo", h)
        load = self._wave(h, 60)
        return {0: int(345 + 1635 * load), 1: int(345 + 1635 * load), 2: 2619, 3: int(765 + 780 * load)}[clock]

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", h)
        on = 1 if self._is_mig_parent(h) else 0
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, slot: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if not self._is_mig_parent(h) or slot >= self.mig:
            raise pynvml.NVMLError_NotFound()
        return _Handle(h.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", h)
        return 7 + (h.mig or 0)

    def nvmlDeviceGetComputeInstanceId(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", h)
        return 0

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", h)
        self._not_on_mig(h)
        load = self._wave(h, 60)
        return SimpleNamespace(gpu=int(100 * load), memory=int(60 * load))

    def nvmlDeviceGetEncoderUtilization(self, h: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetEncoderUtilization", h)
        self._not_on_mig(h)
        return [int(10 * self._wave(h, 90)), 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetDecoderUtilization", h)
        self._not_on_mig(h)
        return [int(20 * self._wave(h, 90, 1.0)), 167000]

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: int | None = None) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", h)
        total = 80 * GIB if h.mig is None else 10 * GIB
        reserved = 512 * 1024**2 if h.mig is None else 0
        used = int((total - reserved) * (0.1 + 0.8 * self._wave(h, 120, 0.5 + (h.mig or 0))))
        used -= used % 4096
        mem = SimpleNamespace(total=total, used=used, free=total - reserved - used)
        if version is not None:
            mem.reserved = reserved
        return mem

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        self._enter("nvmlDeviceGetTemperature", h)
        return int(34 + 40 * self._wave(h, 120))

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPowerUsage", h)
        return int(70000 + 550000 * self._wave(h, 60))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return 700000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        elapsed = self.clock() - self.start
        return int(5_000_000_000 + 345_000 * elapsed + 1000 * h.index)  # mJ, mean power 345 W

    def nvmlDeviceGetPerformanceState(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPerformanceState", h)
        return 0 if self._wave(h, 60) > 0.1 else 8

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        load = self._wave(h, 60)
        return 0x1 if load < 0.1 else (0x4 if load > 0.9 else 0)

    def nvmlDeviceGetFanSpeed(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetFanSpeed", h)
        raise pynvml.NVMLError_NotSupported()  # passively cooled data-centre card

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        self._enter("nvmlDeviceGetPcieThroughput", h)
        return int(2_000_000 * self._wave(h, 30, counter))

    def nvmlDeviceGetPcieReplayCounter(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", h)
        return 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: _Handle) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetTotalEccErrors(self, h: _Handle, error_type: int, counter_type: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        return 3 if error_type == 0 and counter_type == 1 else 0

    def nvmlDeviceGetRemappedRows(self, h: _Handle) -> tuple[int, int, int, int]:
        self._enter("nvmlDeviceGetRemappedRows", h)
        return self.remapped_rows.get(h.index, (1, 0, 0, 0))

    def nvmlDeviceGetRetiredPages(self, h: _Handle, cause: int) -> list[int]:
        self._enter("nvmlDeviceGetRetiredPages", h)
        raise pynvml.NVMLError_NotSupported()  # Hopper remaps rows instead of retiring pages

    def nvmlDeviceGetFieldValues(self, h: _Handle, ids: list[Any]) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetFieldValues", h)
        out = []
        elapsed = self.clock() - self.start
        for item in ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            ret, kind, value = 0, 3, SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0)
            if fid == 82:  # memory temperature
                value.uiVal, kind = int(40 + 30 * self._wave(h, 120)), 1
            elif fid == 91:  # NVLink link count
                value.uiVal, kind = 18, 1
            elif fid in (138, 139):  # NVLink data KiB, cumulative
                value.ullVal = int((1000 + 10 * scope) * elapsed * (2 if fid == 138 else 3))
            else:
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=ret, valueType=kind, value=value))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[SimpleNamespace]:
        if "nvmlDeviceGetComputeRunningProcesses_v3" in self.missing:
            # what pynvml's unversioned wrapper raises on a driver before R510 (not an NVMLError)
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...")
        return self.nvmlDeviceGetComputeRunningProcesses_v2(h, call="nvmlDeviceGetComputeRunningProcesses")

    def nvmlDeviceGetComputeRunningProcesses_v2(
        self, h: _Handle, call: str = "nvmlDeviceGetComputeRunningProcesses_v2"
    ) -> list[SimpleNamespace]:
        self._enter(call, h)
        key = h.index if h.mig is None else 1000 + h.index * 10 + h.mig
        if key in self.processes:
            procs = self.processes[key]
        elif self._is_mig_parent(h):
            procs = []
        else:
            procs = [(4000 + key * 10 + i, (2 + i) * GIB, 0) for i in range(self.processes_per_gpu)]
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, mem, _ in procs
        ]

    def nvmlDeviceGetProcessUtilization(self, h: _Handle, since: int) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetProcessUtilization", h)
        self._not_on_mig(h)
        now_us = int(self.clock() * 1e6)
        procs = self.processes.get(h.index)
        if procs is None:
            procs = [
                (
                    4000 + h.index * 10 + i,
                    None,
                    int(100 * self._wave(h, 60)) // max(1, self.processes_per_gpu),
                )
                for i in range(self.processes_per_gpu)
            ]
        if not procs:
            raise pynvml.NVMLError_NotFound()
        return [
            SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, encUtil=0, decUtil=0, timeStamp=now_us)
            for pid, _, sm in procs
        ]

    def nvmlGpmQueryDeviceSupport(self, h: _Handle) -> SimpleNamespace:
        self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(isSupportedDevice=0 if self._is_mig_parent(h) else 1)

    def nvmlGpmSampleAlloc(self) -> SimpleNamespace:
        self._enter("nvmlGpmSampleAlloc")
        return SimpleNamespace(taken=None, handle=None)

    def nvmlGpmSampleFree(self, sample: SimpleNamespace) -> None:
        self._enter("nvmlGpmSampleFree")

    def nvmlGpmSampleGet(self, h: _Handle, sample: SimpleNamespace) -> SimpleNamespace:
        self._enter("nvmlGpmSampleGet", h)
        sample.taken = self.clock()
        sample.handle = h
        return sample

    def nvmlGpmMetricsGet(self, request: _GpmRequest) -> _GpmRequest:
        h = request.sample2.handle
        self._enter("nvmlGpmMetricsGet", h)
        load = self._wave(h, 60)
        shares = {2: 0.9, 3: 0.5, 5: 0.6, 10: 0.7, 11: 0.05, 12: 0.3, 13: 0.2}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.value = 100.0 * load * shares.get(metric.metricId, 0.0)
            metric.nvmlReturn = 0 if metric.metricId in shares else pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlEventSetCreate(self) -> object:
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, h: _Handle, types: int, event_set: object) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        self._enter("nvmlEventSetWait_v2")
        try:
            event = self._events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        return event

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._enter("nvmlEventSetFree")


def create(config: Config) -> NvmlBackend:
    cost = {"nvmlDeviceGetPcieThroughput": config.fake_pcie_call_seconds} if config.fake_pcie_call_seconds else None
    sim = SimNvml(gpus=config.fake_gpus, mig=config.fake_mig, seed=config.fake_seed, call_cost=cost)
    backend = NvmlBackend(config, nvml=sim)
    backend.name = "fake"  # the NVML backend code, on simulated GPUs: say so in logs and self-metrics
    return backend
