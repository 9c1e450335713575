"""Simulated GPUs: a stand-in for the NVML library, read by the real NVML backend.

``--gpu-vendor=fake`` runs the exporter on this simulator, so the quick start, demos and benchmarks
exercise the same backend code as a real NVIDIA node. Values are plausible and vary with time
(a slow sine per GPU). Tests use the same simulator with faults injected: a call raising a given
``pynvml.NVMLError_*`` class, a function missing from the "driver", a GPU lost mid-run, XID events.

Faithful to the real wrapper where the backend's behaviour depends on it: handles (devices, MIG
instances, GPM samples, event sets) are ctypes pointers of pynvml's own types, so they are unhashable
and compare by identity as in production; errors are pynvml's own ``NVMLError_*`` classes, raised where
pynvml raises them (``NVMLLibraryMismatchError`` from its unversioned process calls); a call given a
cost blocks in ``time.sleep``, which releases the GIL as ctypes does around a driver call. The C
library tests/fakes/fake_nvml.c computes the same readings, and tests/unit/backends/nvidia/test_nvml_fidelity.py runs one
scenario set through both and compares what the backend makes of them.
"""

from __future__ import annotations

import ctypes
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pynvml

from gpu_exporter.backends.fake.throttle import ThrottleSim
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.backends.nvidia.xid import handle_address
from gpu_exporter.config import Config

__all__ = ["SimNvml", "create"]

GIB = 1024**3
_MODEL = "NVIDIA H100 80GB HBM3"
_MIG_PROFILES = ("1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb", "1g.10gb")
_SLOTS = 8  # handle addresses per GPU: the GPU itself, then one per MIG slot


class _Where:
    """What a handle points at: a GPU and, for a MIG instance, its slot."""

    __slots__ = ("index", "mig")

    def __init__(self, index: int, mig: int | None) -> None:
        self.index = index
        self.mig = mig


class SimNvml(ThrottleSim):
    """Quacks like the ``pynvml`` module for the calls the NVML backend makes."""

    __name__ = "simulated"

    # constants and error classes come from the real module
    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    NVML_GPM_METRICS_GET_VERSION = pynvml.NVML_GPM_METRICS_GET_VERSION
    c_nvmlGpmMetricsGet_t = pynvml.c_nvmlGpmMetricsGet_t

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
        self._events: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        # what a handle names follows from the address it holds
        self._memory: list[Any] = []  # what device handles point into; kept, so no address is reused
        self._base: dict[int, int] = {}  # GPU -> the address its current handles start at
        self._at: dict[int, _Where] = {}  # address -> the device a handle holding it names
        self._gpm_samples: dict[int, tuple[Any, list[int | None]]] = {}  # address -> (memory, [GPU index])
        self._event_set = ctypes.create_string_buffer(1)
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
        """The GPU answers again, with new handles (as after a reset): the old ones are invalid."""
        self.lost.discard(index)
        with self._lock:
            base = self._base.pop(index, 0)
            for slot in range(_SLOTS if base else 0):
                self._at.pop(base + slot, None)

    def xid(self, index: int, code: int) -> None:
        event = pynvml.c_nvmlEventData_t()
        event.device = self._handle(index)
        event.eventType = pynvml.nvmlEventTypeXidCriticalError
        event.eventData = code
        event.gpuInstanceId = event.computeInstanceId = 0xFFFFFFFF
        self._events.put(event)

    def index_of(self, handle: Any) -> int | None:
        """The GPU a handle belongs to (a MIG instance's parent); None for anything else."""
        where = self._where(handle)
        return None if where is None else where.index

    # -- plumbing --------------------------------------------------------------------------------

    def _handle(self, index: int, mig: int | None = None) -> Any:
        """A new pointer object for the device, as pynvml returns one per call."""
        with self._lock:
            if index not in self._base:
                memory = ctypes.create_string_buffer(_SLOTS)
                self._memory.append(memory)
                base = self._base[index] = ctypes.addressof(memory)
                for slot in range(_SLOTS):
                    self._at[base + slot] = _Where(index, None if slot == 0 else slot - 1)
            address = self._base[index] + (0 if mig is None else 1 + mig)
        return ctypes.cast(address, pynvml.c_nvmlDevice_t)

    def _where(self, handle: Any) -> _Where | None:
        where = self._at.get(handle_address(handle) or 0)
        if where is None or not 0 <= where.index < self.gpus:
            return None
        if where.mig is not None and not (self._is_mig_parent(_Where(where.index, None)) and where.mig < self.mig):
            return None
        return where

    def _enter(self, call: str, handle: Any = None) -> _Where:
        """Count and pay for a call, then raise what the scenario says it raises.

        The device the handle points at, for calls made with one; an unknown handle is an invalid
        argument, as in the driver.
        """
        with self._lock:
            self.calls[call] += 1
        self._pay(call)
        if call in self.missing:
            raise pynvml.NVMLError_FunctionNotFound()
        where = self._where(handle) if handle is not None else None
        if handle is not None and where is None:
            raise pynvml.NVMLError_InvalidArgument()
        index = where.index if where is not None else None
        if index is not None and index in self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        error = self.faults.get((index, call)) or self.faults.get((None, call))
        if error is not None:
            raise error()
        return where if where is not None else _Where(-1, None)

    def _wave(self, where: _Where, period: float, phase: float = 0.0) -> float:
        """0..1, smooth, different per GPU."""
        t = self.clock() - self.start
        return 0.5 + 0.5 * math.sin(t / period + where.index * 1.7 + self.seed + phase)

    def _is_mig_parent(self, where: _Where) -> bool:
        return self.mig > 0 and where.index == 0 and where.mig is None

    def _not_on_mig(self, where: _Where) -> None:
        if where.mig is not None or self._is_mig_parent(where):
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

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        handle = self._handle(index) if 0 <= index < self.gpus else None
        self._enter("nvmlDeviceGetHandleByIndex", handle)
        if handle is None:
            raise pynvml.NVMLError_InvalidArgument()
        return handle

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        w = self._enter("nvmlDeviceGetUUID", h)
        if w.mig is not None:
            return f"MIG-{self.seed:04x}{w.index:04x}-{w.mig:04x}-4000-8000-00000000a1{w.mig:02x}"
        return f"GPU-{self.seed:08x}-{w.index:04x}-4000-8000-0000000000{w.index:02x}"

    def nvmlDeviceGetName(self, h: Any) -> str:
        w = self._enter("nvmlDeviceGetName", h)
        if w.mig is not None:
            return f"{_MODEL} MIG {_MIG_PROFILES[w.mig]}"
        return _MODEL

    def nvmlDeviceGetSerial(self, h: Any) -> str:
        w = self._enter("nvmlDeviceGetSerial", h)
        return f"16523{self.seed:03d}{w.index:05d}"

    def nvmlDeviceGetPciInfo(self, h: Any) -> SimpleNamespace:
        w = self._enter("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=f"00000000:{0x18 + w.index * 0x10:02X}:00.0".encode())

    def nvmlDeviceGetMinorNumber(self, h: Any) -> int:
        return self._enter("nvmlDeviceGetMinorNumber", h).index

    def nvmlDeviceGetMaxClockInfo(self, h: Any, clock: int) -> int:
        self._enter("nvmlDeviceGetMaxClockInfo", h)
        return {0: 1980, 1: 1980, 2: 2619, 3: 1545}[clock]

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        w = self._enter("nvmlDeviceGetClockInfo", h)
        load = self._wave(w, 60)
        return {0: int(345 + 1635 * load), 1: int(345 + 1635 * load), 2: 2619, 3: int(765 + 780 * load)}[clock]

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        w = self._enter("nvmlDeviceGetMigMode", h)
        on = 1 if self._is_mig_parent(w) else 0
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Any) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Any, slot: int) -> Any:
        w = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if not self._is_mig_parent(w) or slot >= self.mig:
            raise pynvml.NVMLError_NotFound()
        return self._handle(w.index, slot)

    def nvmlDeviceGetGpuInstanceId(self, h: Any) -> int:
        w = self._enter("nvmlDeviceGetGpuInstanceId", h)
        return 7 + (w.mig or 0)

    def nvmlDeviceGetComputeInstanceId(self, h: Any) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", h)
        return 0

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> SimpleNamespace:
        w = self._enter("nvmlDeviceGetUtilizationRates", h)
        self._not_on_mig(w)
        load = self._wave(w, 60)
        return SimpleNamespace(gpu=int(100 * load), memory=int(60 * load))

    def nvmlDeviceGetEncoderUtilization(self, h: Any) -> list[int]:
        w = self._enter("nvmlDeviceGetEncoderUtilization", h)
        self._not_on_mig(w)
        return [int(10 * self._wave(w, 90)), 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: Any) -> list[int]:
        w = self._enter("nvmlDeviceGetDecoderUtilization", h)
        self._not_on_mig(w)
        return [int(20 * self._wave(w, 90, 1.0)), 167000]

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> SimpleNamespace:
        w = self._enter("nvmlDeviceGetMemoryInfo", h)
        if version and version != pynvml.nvmlMemory_v2:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        total = 80 * GIB if w.mig is None else 10 * GIB
        reserved = 512 * 1024**2 if w.mig is None else 0
        used = int((total - reserved) * (0.1 + 0.8 * self._wave(w, 120, 0.5 + (w.mig or 0))))
        used -= used % 4096
        mem = SimpleNamespace(total=total, used=used, free=total - reserved - used)
        if version:
            mem.reserved = reserved
        return mem

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        w = self._enter("nvmlDeviceGetTemperature", h)
        return int(34 + 40 * self._wave(w, 120))

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        w = self._enter("nvmlDeviceGetPowerUsage", h)
        return int(70000 + 550000 * self._wave(w, 60))

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return 700000

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        w = self._enter("nvmlDeviceGetTotalEnergyConsumption", h)
        elapsed = self.clock() - self.start
        return int(5_000_000_000 + 345_000 * elapsed + 1000 * w.index)  # mJ, mean power 345 W

    def nvmlDeviceGetPerformanceState(self, h: Any) -> int:
        w = self._enter("nvmlDeviceGetPerformanceState", h)
        return 0 if self._wave(w, 60) > 0.1 else 8

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        w = self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        load = self._wave(w, 60)
        return 0x1 if load < 0.1 else (0x4 if load > 0.9 else 0)

    def nvmlDeviceGetFanSpeed(self, h: Any) -> int:
        self._enter("nvmlDeviceGetFanSpeed", h)
        raise pynvml.NVMLError_NotSupported()  # passively cooled data-centre card

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        w = self._enter("nvmlDeviceGetPcieThroughput", h)
        return int(2_000_000 * self._wave(w, 30, counter))

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        self._enter("nvmlDeviceGetPcieReplayCounter", h)
        return 0

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: Any) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkGeneration", h)
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: Any) -> int:
        self._enter("nvmlDeviceGetCurrPcieLinkWidth", h)
        return 16

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", h)
        return 3 if error_type == 0 and counter_type == 1 else 0

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        w = self._enter("nvmlDeviceGetRemappedRows", h)
        return self.remapped_rows.get(w.index, (1, 0, 0, 0))

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        self._enter("nvmlDeviceGetRetiredPages", h)
        raise pynvml.NVMLError_NotSupported()  # Hopper remaps rows instead of retiring pages

    def nvmlDeviceGetFieldValues(self, h: Any, ids: list[Any]) -> list[SimpleNamespace]:
        w = self._enter("nvmlDeviceGetFieldValues", h)
        out = []
        elapsed = self.clock() - self.start
        for item in ids:
            fid, scope = item if isinstance(item, tuple) else (item, 0)
            ret, kind, value = 0, 3, SimpleNamespace(dVal=0.0, uiVal=0, ulVal=0, ullVal=0, sllVal=0, siVal=0)
            if fid == 82:  # memory temperature
                value.uiVal, kind = int(40 + 30 * self._wave(w, 120)), 1
            elif fid == 91:  # NVLink link count
                value.uiVal, kind = 18, 1
            elif fid in (138, 139):  # NVLink data KiB, cumulative
                value.ullVal = int((1000 + 10 * scope) * elapsed * (2 if fid == 138 else 3))
            else:
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=fid, scopeId=scope, nvmlReturn=ret, valueType=kind, value=value))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[SimpleNamespace]:
        """pynvml's unversioned call: the _v3 list, and NVMLLibraryMismatchError (not an NVMLError) on a
        driver without it (before R510)."""
        try:
            if "nvmlDeviceGetComputeRunningProcesses_v3" in self.missing:
                raise pynvml.NVMLError_FunctionNotFound()
            return self.nvmlDeviceGetComputeRunningProcesses_v2(h, call="nvmlDeviceGetComputeRunningProcesses")
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...") from None

    def nvmlDeviceGetComputeRunningProcesses_v2(
        self, h: Any, call: str = "nvmlDeviceGetComputeRunningProcesses_v2"
    ) -> list[SimpleNamespace]:
        w = self._enter(call, h)
        key = w.index if w.mig is None else 1000 + w.index * 10 + w.mig
        if key in self.processes:
            procs = self.processes[key]
        elif self._is_mig_parent(w):
            procs = []
        else:
            procs = [(4000 + key * 10 + i, (2 + i) * GIB, 0) for i in range(self.processes_per_gpu)]
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, mem, _ in procs
        ]

    def nvmlDeviceGetProcessUtilization(self, h: Any, since: int) -> list[SimpleNamespace]:
        try:  # pynvml's unversioned call, as above
            w = self._enter("nvmlDeviceGetProcessUtilization", h)
        except pynvml.NVMLError_FunctionNotFound:
            raise pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version ...") from None
        self._not_on_mig(w)
        now_us = int(self.clock() * 1e6)
        procs = self.processes.get(w.index)
        if procs is None:
            procs = [
                (
                    4000 + w.index * 10 + i,
                    None,
                    int(100 * self._wave(w, 60)) // max(1, self.processes_per_gpu),
                )
                for i in range(self.processes_per_gpu)
            ]
        if not procs:
            raise pynvml.NVMLError_NotFound()
        return [
            SimpleNamespace(pid=pid, smUtil=sm, memUtil=0, encUtil=0, decUtil=0, timeStamp=now_us)
            for pid, _, sm in procs
        ]

    def nvmlGpmQueryDeviceSupport(self, h: Any) -> SimpleNamespace:
        w = self._enter("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(isSupportedDevice=0 if self._is_mig_parent(w) else 1)

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        memory = ctypes.create_string_buffer(1)
        address = ctypes.addressof(memory)
        with self._lock:
            self._gpm_samples[address] = (memory, [None])
        return ctypes.cast(address, pynvml.c_nvmlGpmSample_t)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        with self._lock:
            self._gpm_samples.pop(handle_address(sample) or 0, None)

    def nvmlGpmSampleGet(self, h: Any, sample: Any) -> Any:
        w = self._enter("nvmlGpmSampleGet", h)
        found = self._gpm_samples.get(handle_address(sample) or 0)
        if found is None:
            raise pynvml.NVMLError_InvalidArgument()
        found[1][0] = w.index
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        found = self._gpm_samples.get(handle_address(request.sample2) or 0)
        index = found[1][0] if found is not None else None
        w = self._enter("nvmlGpmMetricsGet", None if index is None else self._handle(index))
        if index is None:
            raise pynvml.NVMLError_InvalidArgument()
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        load = self._wave(w, 60)
        shares = {2: 0.9, 3: 0.5, 5: 0.6, 10: 0.7, 11: 0.05, 12: 0.3, 13: 0.2}
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            metric.value = 100.0 * load * shares.get(metric.metricId, 0.0)
            metric.nvmlReturn = 0 if metric.metricId in shares else pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return ctypes.cast(ctypes.addressof(self._event_set), pynvml.c_nvmlEventSet_t)

    def nvmlDeviceRegisterEvents(self, h: Any, types: int, event_set: Any) -> None:
        self._enter("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        try:
            event = self._events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError_Timeout() from None
        return event

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree")


def create(config: Config) -> NvmlBackend:
    cost = {"nvmlDeviceGetPcieThroughput": config.fake_pcie_call_seconds} if config.fake_pcie_call_seconds else None
    sim = SimNvml(gpus=config.fake_gpus, mig=config.fake_mig, seed=config.fake_seed, call_cost=cost)
    backend = NvmlBackend(config, nvml=sim)
    backend.name = "fake"  # the NVML backend code, on simulated GPUs: say so in logs and self-metrics
    return backend
