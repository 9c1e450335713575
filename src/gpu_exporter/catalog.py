"""Every device metric, once: its key, Prometheus name, type, unit, help, group and DCGM name.

Backends produce values keyed by ``Metric.key`` in base units (bytes, seconds, watts, joules, hertz,
ratios 0-1). Several keys may share one Prometheus family and tell themselves apart by constant
labels (``gpu_temperature_celsius{sensor="gpu"}`` and ``{sensor="memory"}``), so each DCGM field maps
to exactly one key. The README's metric table is generated from this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["CATALOG", "GROUPS", "Family", "Metric", "by_key", "families", "kept_keys", "name_filter"]

MetricType = Literal["gauge", "counter"]

MiB = 1.0 / (1024 * 1024)


@dataclass(frozen=True, slots=True)
class Metric:
    key: str
    name: str
    type: MetricType
    help: str
    group: str
    const_labels: tuple[tuple[str, str], ...] = ()
    labels: tuple[str, ...] = ()  # dynamic labels, values supplied with each reading
    dcgm: str = ""  # dcgm-exporter's field name for the same quantity, if it has one
    dcgm_scale: float = 1.0  # multiply our base-unit value by this to get DCGM's unit
    dcgm_type: MetricType | None = None


def _m(
    key: str,
    name: str,
    type_: MetricType,
    help_: str,
    group: str,
    const: dict[str, str] | None = None,
    labels: tuple[str, ...] = (),
    dcgm: str = "",
    scale: float = 1.0,
    dcgm_type: MetricType | None = None,
) -> Metric:
    return Metric(key, name, type_, help_, group, tuple((const or {}).items()), labels, dcgm, scale, dcgm_type)


_TEMP = "Temperature in degrees Celsius, by sensor."
_CLOCK = "Current clock frequency in hertz, by clock domain."
_MAXCLOCK = "Maximum clock frequency in hertz, by clock domain."
_PCIE = "PCIe throughput in bytes per second, by direction."
_POD = ("namespace", "pod", "container")  # labels of the per-pod series

CATALOG: tuple[Metric, ...] = (
    # utilization
    _m(
        "utilization",
        "gpu_utilization_ratio",
        "gauge",
        "Fraction of the last sample period during which a kernel ran on the GPU (0-1).",
        "utilization",
        dcgm="DCGM_FI_DEV_GPU_UTIL",
        scale=100,
    ),
    _m(
        "memory_utilization",
        "gpu_memory_utilization_ratio",
        "gauge",
        "Fraction of the last sample period during which device memory was read or written (0-1).",
        "utilization",
        dcgm="DCGM_FI_DEV_MEM_COPY_UTIL",
        scale=100,
    ),
    _m(
        "encoder_utilization",
        "gpu_encoder_utilization_ratio",
        "gauge",
        "Video encoder utilization (0-1).",
        "utilization",
        dcgm="DCGM_FI_DEV_ENC_UTIL",
        scale=100,
    ),
    _m(
        "decoder_utilization",
        "gpu_decoder_utilization_ratio",
        "gauge",
        "Video decoder utilization (0-1).",
        "utilization",
        dcgm="DCGM_FI_DEV_DEC_UTIL",
        scale=100,
    ),
    # memory
    _m(
        "memory_total",
        "gpu_memory_total_bytes",
        "gauge",
        "Total device memory in bytes.",
        "memory",
        dcgm="DCGM_FI_DEV_FB_TOTAL",
        scale=MiB,
    ),
    _m(
        "memory_used",
        "gpu_memory_used_bytes",
        "gauge",
        "Device memory in use, in bytes.",
        "memory",
        dcgm="DCGM_FI_DEV_FB_USED",
        scale=MiB,
    ),
    _m(
        "memory_free",
        "gpu_memory_free_bytes",
        "gauge",
        "Free device memory, in bytes.",
        "memory",
        dcgm="DCGM_FI_DEV_FB_FREE",
        scale=MiB,
    ),
    _m(
        "memory_reserved",
        "gpu_memory_reserved_bytes",
        "gauge",
        "Device memory reserved by the driver, in bytes.",
        "memory",
        dcgm="DCGM_FI_DEV_FB_RESERVED",
        scale=MiB,
    ),
    _m(
        "shared_memory_used",
        "gpu_shared_memory_used_bytes",
        "gauge",
        "System RAM in use by everything on a GPU that shares it with the CPU (Jetson), in bytes.",
        "memory",
    ),
    # temperature
    _m(
        "temp_gpu",
        "gpu_temperature_celsius",
        "gauge",
        _TEMP,
        "temperature",
        {"sensor": "gpu"},
        dcgm="DCGM_FI_DEV_GPU_TEMP",
    ),
    _m(
        "temp_memory",
        "gpu_temperature_celsius",
        "gauge",
        _TEMP,
        "temperature",
        {"sensor": "memory"},
        dcgm="DCGM_FI_DEV_MEMORY_TEMP",
    ),
    _m("temp_junction", "gpu_temperature_celsius", "gauge", _TEMP, "temperature", {"sensor": "junction"}),
    # power and energy
    _m("power", "gpu_power_watts", "gauge", "Power draw in watts.", "power", dcgm="DCGM_FI_DEV_POWER_USAGE"),
    _m(
        "power_limit",
        "gpu_power_limit_watts",
        "gauge",
        "Enforced power limit in watts.",
        "power",
        dcgm="DCGM_FI_DEV_POWER_MGMT_LIMIT",
    ),
    _m(
        "energy",
        "gpu_energy_joules_total",
        "counter",
        "Energy consumed since the driver was loaded, in joules.",
        "power",
        dcgm="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        scale=1000,
        dcgm_type="counter",
    ),
    # clocks
    _m("clock_graphics", "gpu_clock_hertz", "gauge", _CLOCK, "clocks", {"clock": "graphics"}),
    _m(
        "clock_sm",
        "gpu_clock_hertz",
        "gauge",
        _CLOCK,
        "clocks",
        {"clock": "sm"},
        dcgm="DCGM_FI_DEV_SM_CLOCK",
        scale=1e-6,
    ),
    _m(
        "clock_memory",
        "gpu_clock_hertz",
        "gauge",
        _CLOCK,
        "clocks",
        {"clock": "memory"},
        dcgm="DCGM_FI_DEV_MEM_CLOCK",
        scale=1e-6,
    ),
    _m(
        "clock_video",
        "gpu_clock_hertz",
        "gauge",
        _CLOCK,
        "clocks",
        {"clock": "video"},
        dcgm="DCGM_FI_DEV_VIDEO_CLOCK",
        scale=1e-6,
    ),
    _m("clock_max_graphics", "gpu_clock_max_hertz", "gauge", _MAXCLOCK, "clocks", {"clock": "graphics"}),
    _m(
        "clock_max_sm",
        "gpu_clock_max_hertz",
        "gauge",
        _MAXCLOCK,
        "clocks",
        {"clock": "sm"},
        dcgm="DCGM_FI_DEV_MAX_SM_CLOCK",
        scale=1e-6,
    ),
    _m(
        "clock_max_memory",
        "gpu_clock_max_hertz",
        "gauge",
        _MAXCLOCK,
        "clocks",
        {"clock": "memory"},
        dcgm="DCGM_FI_DEV_MAX_MEM_CLOCK",
        scale=1e-6,
    ),
    _m("clock_max_video", "gpu_clock_max_hertz", "gauge", _MAXCLOCK, "clocks", {"clock": "video"}),
    _m(
        "clock_event_reason",
        "gpu_clock_event_reason_active",
        "gauge",
        "1 while the named reason holds clocks down (throttling), else 0.",
        "clocks",
        labels=("reason",),
    ),
    _m(
        "performance_state",
        "gpu_performance_state",
        "gauge",
        "Performance state: 0 is maximum performance, 15 minimum.",
        "clocks",
        dcgm="DCGM_FI_DEV_PSTATE",
    ),
    # fan
    _m(
        "fan_speed",
        "gpu_fan_speed_ratio",
        "gauge",
        "Fan speed as a fraction of its maximum (0-1).",
        "fan",
        dcgm="DCGM_FI_DEV_FAN_SPEED",
        scale=100,
    ),
    # pcie
    _m(
        "pcie_tx",
        "gpu_pcie_throughput_bytes_per_second",
        "gauge",
        _PCIE,
        "pcie",
        {"direction": "tx"},
        dcgm="DCGM_FI_PROF_PCIE_TX_BYTES",
    ),
    _m(
        "pcie_rx",
        "gpu_pcie_throughput_bytes_per_second",
        "gauge",
        _PCIE,
        "pcie",
        {"direction": "rx"},
        dcgm="DCGM_FI_PROF_PCIE_RX_BYTES",
    ),
    _m(
        "pcie_replay",
        "gpu_pcie_replay_errors_total",
        "counter",
        "PCIe replay events.",
        "pcie",
        dcgm="DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        dcgm_type="counter",
    ),
    _m(
        "pcie_link_generation",
        "gpu_pcie_link_generation",
        "gauge",
        "Current PCIe link generation.",
        "pcie",
        dcgm="DCGM_FI_DEV_PCIE_LINK_GEN",
    ),
    _m(
        "pcie_link_width",
        "gpu_pcie_link_width",
        "gauge",
        "Current PCIe link width (lanes).",
        "pcie",
        dcgm="DCGM_FI_DEV_PCIE_LINK_WIDTH",
    ),
    # ecc and memory health
    _m(
        "ecc_corrected_volatile",
        "gpu_ecc_errors_total",
        "counter",
        "ECC errors by type and scope (volatile: since driver load; aggregate: lifetime).",
        "ecc",
        {"type": "corrected", "scope": "volatile"},
        dcgm="DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        dcgm_type="counter",
    ),
    _m(
        "ecc_uncorrected_volatile",
        "gpu_ecc_errors_total",
        "counter",
        "ECC errors by type and scope (volatile: since driver load; aggregate: lifetime).",
        "ecc",
        {"type": "uncorrected", "scope": "volatile"},
        dcgm="DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        dcgm_type="counter",
    ),
    _m(
        "ecc_corrected_aggregate",
        "gpu_ecc_errors_total",
        "counter",
        "ECC errors by type and scope (volatile: since driver load; aggregate: lifetime).",
        "ecc",
        {"type": "corrected", "scope": "aggregate"},
        dcgm="DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        dcgm_type="counter",
    ),
    _m(
        "ecc_uncorrected_aggregate",
        "gpu_ecc_errors_total",
        "counter",
        "ECC errors by type and scope (volatile: since driver load; aggregate: lifetime).",
        "ecc",
        {"type": "uncorrected", "scope": "aggregate"},
        dcgm="DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        dcgm_type="counter",
    ),
    _m(
        "remapped_rows_correctable",
        "gpu_remapped_rows_total",
        "counter",
        "Memory rows remapped, by the kind of error that caused it.",
        "ecc",
        {"type": "correctable"},
        dcgm="DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        dcgm_type="counter",
    ),
    _m(
        "remapped_rows_uncorrectable",
        "gpu_remapped_rows_total",
        "counter",
        "Memory rows remapped, by the kind of error that caused it.",
        "ecc",
        {"type": "uncorrectable"},
        dcgm="DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        dcgm_type="counter",
    ),
    _m(
        "remapped_rows_pending",
        "gpu_remapped_rows_pending",
        "gauge",
        "1 when a row remapping is pending (takes effect after a GPU reset).",
        "ecc",
    ),
    _m(
        "remapped_rows_failure",
        "gpu_remapped_rows_failed",
        "gauge",
        "1 when a row remapping has failed (the GPU needs service).",
        "ecc",
        dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE",
    ),
    _m(
        "retired_pages_sbe",
        "gpu_retired_pages",
        "gauge",
        "Memory pages retired, by cause.",
        "ecc",
        {"cause": "multiple_single_bit"},
        dcgm="DCGM_FI_DEV_RETIRED_SBE",
    ),
    _m(
        "retired_pages_dbe",
        "gpu_retired_pages",
        "gauge",
        "Memory pages retired, by cause.",
        "ecc",
        {"cause": "double_bit"},
        dcgm="DCGM_FI_DEV_RETIRED_DBE",
    ),
    # nvlink
    _m(
        "nvlink_tx",
        "gpu_nvlink_transmitted_bytes_total",
        "counter",
        "NVLink data bytes sent, by link.",
        "nvlink",
        labels=("link",),
    ),
    _m(
        "nvlink_rx",
        "gpu_nvlink_received_bytes_total",
        "counter",
        "NVLink data bytes received, by link.",
        "nvlink",
        labels=("link",),
    ),
    # processes
    _m("processes", "gpu_processes", "gauge", "Compute processes running on the device.", "processes"),
    _m(
        "processes_memory",
        "gpu_processes_memory_used_bytes",
        "gauge",
        "Device memory used by compute processes, in bytes (where the driver reports it).",
        "processes",
    ),
    # gpm (Hopper and newer)
    _m(
        "sm_active",
        "gpu_sm_active_ratio",
        "gauge",
        "Fraction of time at least one warp was active on an SM, averaged over SMs (0-1).",
        "gpm",
        dcgm="DCGM_FI_PROF_SM_ACTIVE",
    ),
    _m(
        "sm_occupancy",
        "gpu_sm_occupancy_ratio",
        "gauge",
        "Resident warps as a fraction of the theoretical maximum, averaged over SMs (0-1).",
        "gpm",
        dcgm="DCGM_FI_PROF_SM_OCCUPANCY",
    ),
    _m(
        "tensor_active",
        "gpu_tensor_active_ratio",
        "gauge",
        "Fraction of cycles a tensor pipe was active (0-1).",
        "gpm",
        dcgm="DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    ),
    _m(
        "dram_active",
        "gpu_dram_active_ratio",
        "gauge",
        "Device memory bandwidth used as a fraction of its peak (0-1).",
        "gpm",
        dcgm="DCGM_FI_PROF_DRAM_ACTIVE",
    ),
    _m(
        "fp64_active",
        "gpu_pipe_active_ratio",
        "gauge",
        "Fraction of cycles a math pipe was active (0-1).",
        "gpm",
        {"pipe": "fp64"},
        dcgm="DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    ),
    _m(
        "fp32_active",
        "gpu_pipe_active_ratio",
        "gauge",
        "Fraction of cycles a math pipe was active (0-1).",
        "gpm",
        {"pipe": "fp32"},
        dcgm="DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    ),
    _m(
        "fp16_active",
        "gpu_pipe_active_ratio",
        "gauge",
        "Fraction of cycles a math pipe was active (0-1).",
        "gpm",
        {"pipe": "fp16"},
        dcgm="DCGM_FI_PROF_PIPE_FP16_ACTIVE",
    ),
    # xid
    _m(
        "xid_errors",
        "gpu_xid_errors_total",
        "counter",
        "XID errors reported by the driver since the agent started, by XID code.",
        "xid",
        labels=("xid",),
    ),
    # per-pod attribution (k8s/): produced by the attributor, forwarded with the device's values
    _m(
        "pod_info",
        "gpu_pod_info",
        "gauge",
        "1 for each container using a GPU, for joins: gpu, uuid, namespace, pod, container.",
        "processes",
        labels=_POD,
    ),
    _m(
        "pod_memory",
        "gpu_pod_memory_used_bytes",
        "gauge",
        "Device memory used by the container's GPU processes, in bytes.",
        "processes",
        labels=_POD,
    ),
    _m(
        "pod_utilization",
        "gpu_pod_utilization_ratio",
        "gauge",
        "Summed SM utilization of the container's GPU processes (0-1 per GPU).",
        "processes",
        labels=_POD,
    ),
    _m(
        "pod_energy",
        "gpu_pod_energy_joules_total",
        "counter",
        "GPU energy above idle attributed to the container by its share of SM utilization, in joules, "
        "since it appeared on the GPU.",
        "processes",
        labels=_POD,
    ),
    # --- GPU health at a glance: throttle time, the health summary, the last XID ---
    *(
        _m(
            f"clock_event_seconds_{reason}",
            "gpu_clock_event_seconds_total",
            "counter",
            "Seconds the clocks were held down, by cause (NVIDIA: since the driver loaded; AMD: since the agent "
            "started).",
            "clocks",
            {"reason": reason},
            dcgm=field,
            scale=1e6,
            dcgm_type="counter",
        )
        for reason, field in (
            ("power", "DCGM_FI_DEV_POWER_VIOLATION"),
            ("thermal", "DCGM_FI_DEV_THERMAL_VIOLATION"),
            ("sync_boost", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION"),
            ("board_limit", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION"),
            ("low_utilization", "DCGM_FI_DEV_LOW_UTIL_VIOLATION"),
            ("reliability", "DCGM_FI_DEV_RELIABILITY_VIOLATION"),
        )
    ),
    _m(
        "health",
        "gpu_health",
        "gauge",
        "Health by subsystem: 0 ok, 1 warning, 2 failure (rules in docs/health.md).",
        "health",
        labels=("subsystem",),
    ),
    _m(
        "xid_last",
        "gpu_xid_last_code",
        "gauge",
        "Code of the most recent XID error since the agent started, 0 when none (gpu_xid_errors_total counts them).",
        "xid",
        dcgm="DCGM_FI_DEV_XID_ERRORS",
    ),
    # --- vendor-specific additions (AMD, Jetson) go below this line ---
    _m(
        "multimedia_utilization",
        "gpu_multimedia_utilization_ratio",
        "gauge",
        "Multimedia (video codec) engine activity, AMD (0-1).",
        "utilization",
    ),
    _m("clock_soc", "gpu_clock_hertz", "gauge", _CLOCK, "clocks", {"clock": "soc"}),
    _m("clock_max_soc", "gpu_clock_max_hertz", "gauge", _MAXCLOCK, "clocks", {"clock": "soc"}),
    _m(
        "clock_min_graphics",
        "gpu_clock_min_hertz",
        "gauge",
        "Lowest clock frequency the governor may choose, in hertz, by clock domain (Jetson).",
        "clocks",
        {"clock": "graphics"},
    ),
    _m(
        "frequency_governor",
        "gpu_frequency_governor",
        "gauge",
        "1 for the devfreq governor that sets the GPU clock (Jetson).",
        "clocks",
        labels=("governor",),
    ),
    _m(
        "pcie_bandwidth",
        "gpu_pcie_bandwidth_bytes_per_second",
        "gauge",
        "PCIe bandwidth in use, both directions together, in bytes per second (AMD).",
        "pcie",
    ),
    _m(
        "ecc_block_corrected",
        "gpu_ecc_block_errors_total",
        "counter",
        "ECC errors by hardware block and type since the driver was loaded (AMD).",
        "ecc",
        {"type": "corrected"},
        labels=("block",),
    ),
    _m(
        "ecc_block_uncorrected",
        "gpu_ecc_block_errors_total",
        "counter",
        "ECC errors by hardware block and type since the driver was loaded (AMD).",
        "ecc",
        {"type": "uncorrected"},
        labels=("block",),
    ),
    _m(
        "board_power",
        "gpu_board_input_power_watts",
        "gauge",
        "Power drawn by the whole module at its input rail, in watts (Jetson).",
        "power",
    ),
    _m(
        "power_rail",
        "gpu_power_rail_watts",
        "gauge",
        "Power on each monitored supply rail, in watts (Jetson INA3221; a rail may feed more than the GPU).",
        "power",
        labels=("rail",),
    ),
)

# collector groups: one per metric group, plus "mig" (per-instance series of MIG devices)
GROUPS: tuple[str, ...] = (*dict.fromkeys(m.group for m in CATALOG), "mig")

_BY_KEY = {m.key: m for m in CATALOG}


def by_key(key: str) -> Metric:
    return _BY_KEY[key]


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    type: MetricType
    help: str
    metrics: tuple[Metric, ...]


def families(metrics: Iterable[Metric] = CATALOG) -> tuple[Family, ...]:
    """Group catalog entries into Prometheus families, keeping catalog order."""
    grouped: dict[str, list[Metric]] = {}
    for m in metrics:
        grouped.setdefault(m.name, []).append(m)
    return tuple(Family(name, ms[0].type, ms[0].help, tuple(ms)) for name, ms in grouped.items())


if len(_BY_KEY) != len(CATALOG):  # pragma: no cover - guarded by tests as well
    raise ValueError("duplicate catalog key")


def markdown_table() -> str:
    """The README's metric list, generated so that it cannot drift from the code."""
    rows = ["| metric | type | labels | group | DCGM equivalent |", "|---|---|---|---|---|"]
    for fam in families():
        consts = sorted({f'{k}="{v}"' for m in fam.metrics for k, v in m.const_labels})
        dynamic = sorted({label for m in fam.metrics for label in m.labels})
        labels = ", ".join([*consts, *dynamic]) or "-"
        groups = ", ".join(dict.fromkeys(m.group for m in fam.metrics))
        dcgm = ", ".join(m.dcgm for m in fam.metrics if m.dcgm) or "-"
        rows.append(f"| `{fam.name}` | {fam.type} | {labels} | {groups} | {dcgm} |")
    return "\n".join(rows) + "\n"


def name_filter(include: str = "", exclude: str = "") -> Callable[[str], bool]:
    """``--metrics.include`` / ``--metrics.exclude`` as a predicate on metric names."""
    inc = re.compile(include) if include else None
    exc = re.compile(exclude) if exclude else None

    def keep(name: str) -> bool:
        if inc is not None and not inc.search(name):
            return False
        return not (exc is not None and exc.search(name))

    return keep


def kept_keys(include: str = "", exclude: str = "") -> frozenset[str] | None:
    """Catalog keys whose metric name passes the filter; None when nothing is filtered."""
    if not include and not exclude:
        return None
    keep = name_filter(include, exclude)
    return frozenset(m.key for m in CATALOG if keep(m.name))
