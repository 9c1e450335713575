"""Readings of the NVML backend that take more than one call: memory, ECC, field values, processes, GPM.

Each takes ``call``, the backend's guarded call (``call(device, name, *args)``: None when the value is
unavailable, raises ``Lost``), and writes into the sample's values ``v``.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from collections.abc import Callable
from typing import Any

from gpu_exporter.backends.nvidia.devices import Device, Mig
from gpu_exporter.model import ProcessUsage, SeriesKey

__all__ = ["GPM_METRICS", "ecc", "field_value", "field_values", "gpm", "memory", "processes"]

Call = Callable[..., Any]

GPM_METRICS = (  # (NVML_GPM_METRIC_* id, catalog key)
    (2, "sm_active"),
    (3, "sm_occupancy"),
    (5, "tensor_active"),
    (10, "dram_active"),
    (11, "fp64_active"),
    (12, "fp32_active"),
    (13, "fp16_active"),
)


def memory(call: Call, nv: Any, device: Device | Mig, h: Any, v: dict[SeriesKey, float]) -> None:
    """Total, used, free and reserved memory (the _v2 struct first)."""
    mem = call(
        device,
        "nvmlDeviceGetMemoryInfo",
        h,
        version=nv.nvmlMemory_v2,
        label="nvmlDeviceGetMemoryInfo_v2",
    )
    if mem is None:
        mem = call(device, "nvmlDeviceGetMemoryInfo", h)
    if mem is None:
        return
    v[("memory_total", ())] = float(mem.total)
    v[("memory_used", ())] = float(mem.used)
    v[("memory_free", ())] = float(mem.free)
    reserved = getattr(mem, "reserved", None)
    if reserved is not None:
        v[("memory_reserved", ())] = float(reserved)


def ecc(call: Call, device: Device, h: Any, v: dict[SeriesKey, float]) -> None:
    """ECC error counts, remapped rows and retired pages."""
    for error_type, kind in ((0, "corrected"), (1, "uncorrected")):  # NVML_MEMORY_ERROR_TYPE_*
        for counter_type, scope in ((0, "volatile"), (1, "aggregate")):  # NVML_*_ECC
            count = call(device, "nvmlDeviceGetTotalEccErrors", h, error_type, counter_type)
            if count is not None:
                v[(f"ecc_{kind}_{scope}", ())] = float(count)
    rows = call(device, "nvmlDeviceGetRemappedRows", h)
    if rows is not None:
        corr, unc, pending, failure = rows
        v[("remapped_rows_correctable", ())] = float(corr)
        v[("remapped_rows_uncorrectable", ())] = float(unc)
        v[("remapped_rows_pending", ())] = 1.0 if pending else 0.0
        v[("remapped_rows_failure", ())] = 1.0 if failure else 0.0
    for cause, key in ((0, "retired_pages_sbe"), (1, "retired_pages_dbe")):
        pages = call(device, "nvmlDeviceGetRetiredPages", h, cause)
        if pages is not None:
            v[(key, ())] = float(len(pages))


def field_values(call: Call, device: Device, ids: list[Any]) -> dict[tuple[int, int], float]:
    """Field values that came back without error, keyed (field id, scope id)."""
    raw = call(device, "nvmlDeviceGetFieldValues", device.handle, ids)
    out: dict[tuple[int, int], float] = {}
    if raw is None:
        return out
    layout = _layout(type(raw)._type_) if isinstance(raw, ctypes.Array) else None
    if layout is not None:  # pynvml's array of c_nvmlFieldValue_t: read from its memory at once
        return _unpacked(memoryview(raw).cast("B"), len(raw), *layout)
    for item in raw:
        if item.nvmlReturn != 0:
            continue
        value = field_value(item)
        if value is not None:
            out[(int(item.fieldId), int(item.scopeId))] = value
    return out


def processes(
    call: Call, is_missing: Callable[[str], bool], device: Device | Mig, h: Any, v: dict[SeriesKey, float]
) -> tuple[ProcessUsage, ...]:
    """The compute processes, their memory and (per GPU, not per MIG instance) their SM use."""
    procs = call(device, "nvmlDeviceGetComputeRunningProcesses", h)
    if procs is None and is_missing("nvmlDeviceGetComputeRunningProcesses"):
        # drivers before R510 have only the _v2 struct; pynvml's unversioned call asks for _v3
        procs = call(device, "nvmlDeviceGetComputeRunningProcesses_v2", h)
    if procs is None:
        return ()
    v[("processes", ())] = float(len(procs))
    known = [p.usedGpuMemory for p in procs if p.usedGpuMemory is not None]
    if known:
        v[("processes_memory", ())] = float(sum(known))
    sm: dict[int, float] = {}
    if procs and isinstance(device, Device):  # not reported per MIG instance
        samples = call(device, "nvmlDeviceGetProcessUtilization", h, device.last_process_ts)
        for s in samples or ():
            sm[int(s.pid)] = s.smUtil / 100.0
            device.last_process_ts = max(device.last_process_ts, int(s.timeStamp))
    return tuple(
        ProcessUsage(int(p.pid), None if p.usedGpuMemory is None else float(p.usedGpuMemory), sm.get(int(p.pid)))
        for p in procs
    )


def gpm(call: Call, nv: Any, device: Device, v: dict[SeriesKey, float]) -> None:
    """GPM metrics are rates between two samples: the first cycle only primes."""
    current, previous = device.gpm_samples
    if call(device, "nvmlGpmSampleGet", device.handle, current) is None:
        return
    if device.gpm_primed:
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_METRICS)
        request.sample1 = previous
        request.sample2 = current
        for i, (metric_id, _) in enumerate(GPM_METRICS):
            request.metrics[i].metricId = metric_id
        result = call(device, "nvmlGpmMetricsGet", request)
        if result is not None:
            for i, (_, key) in enumerate(GPM_METRICS):
                metric = result.metrics[i]
                if metric.nvmlReturn == 0:
                    v[(key, ())] = max(0.0, min(1.0, float(metric.value) / 100.0))
    device.gpm_samples = [previous, current]
    device.gpm_primed = True


def field_value(item: Any) -> float | None:
    kind = int(item.valueType)
    value = item.value
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    return float(getattr(value, attr)) if attr else None


# nvmlValue_t's members by nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE .. _UNSIGNED_SHORT)
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")
_HEADER = ("fieldId", "scopeId", "valueType", "nvmlReturn")
Layout = tuple[int, struct.Struct, int, tuple[struct.Struct, ...]]


@functools.lru_cache(maxsize=4)
def _layout(item: Any) -> Layout | None:
    """How to read an array of pynvml's ``c_nvmlFieldValue_t`` straight from its memory: the struct's
    size, its header fields (``_HEADER``, at the offsets ctypes gives them) as one ``struct`` format, the
    value's offset and one format per value type. None when the struct is not as expected (then each
    item is read through its attributes, as before): a wrapper of another shape is read correctly, only
    slower. Reading the memory at once costs a fraction of the six attribute reads per value, each
    through pynvml's ``__getattribute__`` (an NVLink GPU answers 36 values a cycle)."""
    try:
        types = dict(item._fields_)
        header = sorted((getattr(item, name).offset, types[name]._type_, name) for name in _HEADER)
        value = item.value.offset
        members = dict(types["value"]._fields_)
        codes = [members[name]._type_ for name in _VALUE_MEMBERS]
    except (AttributeError, KeyError, TypeError):
        return None
    if [name for _, _, name in header] != list(_HEADER):
        return None  # the header is read in _HEADER's order
    if not all(isinstance(code, str) and len(code) == 1 for code in [*codes, *(c for _, c, _ in header)]):
        return None  # not all simple C types
    fmt, at = "@", 0
    for offset, code, _ in header:
        if offset < at:
            return None
        fmt += "x" * (offset - at) + code
        at = offset + struct.calcsize("@" + code)
    return ctypes.sizeof(item), struct.Struct(fmt), value, tuple(struct.Struct("@" + c) for c in codes)


def _unpacked(
    data: memoryview, n: int, size: int, header: struct.Struct, value_at: int, kinds: tuple[struct.Struct, ...]
) -> dict[tuple[int, int], float]:
    """What ``field_values`` makes of the items one by one: those answered, of a known value type."""
    out: dict[tuple[int, int], float] = {}
    for base in range(0, n * size, size):
        fid, scope, kind, ret = header.unpack_from(data, base)
        if ret == 0 and 0 <= kind < len(kinds):
            out[(fid, scope)] = float(kinds[kind].unpack_from(data, base + value_at)[0])
    return out
