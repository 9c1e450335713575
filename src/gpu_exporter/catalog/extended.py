"""Catalog entries: ECC and memory health, NVLink, processes, GPM, XID, per-pod use, GPU health."""

from __future__ import annotations

from gpu_exporter.catalog.metric import POD_LABELS, PROCESS_LABELS, Metric, MetricType, Variant, entry, family

# the per-pod series (k8s/): produced by the attributor, forwarded with the device's values
_POD: tuple[tuple[str, str, MetricType, str], ...] = (
    (
        "pod_info",
        "gpu_pod_info",
        "gauge",
        "1 for each container using or holding a GPU, for joins: gpu, uuid, namespace, pod, container, pod_uid.",
    ),
    (
        "pod_memory",
        "gpu_pod_memory_used_bytes",
        "gauge",
        "Device memory used by the container's GPU processes, in bytes.",
    ),
    (
        "pod_utilization",
        "gpu_pod_utilization_ratio",
        "gauge",
        "Summed SM utilization of the container's GPU processes (0-1 per GPU).",
    ),
    (
        "pod_energy",
        "gpu_pod_energy_joules_total",
        "counter",
        "GPU energy above idle attributed to the container by its share of SM utilization, in joules, "
        "since it appeared on the GPU.",
    ),
)

METRICS: tuple[Metric, ...] = (
    # ecc and memory health
    *family(
        "gpu_ecc_errors_total",
        "counter",
        "ECC errors by type and scope (volatile: since driver load; aggregate: lifetime).",
        "ecc",
        Variant(
            "ecc_corrected_volatile",
            {"type": "corrected", "scope": "volatile"},
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Single-bit volatile ECC errors",
        ),
        Variant(
            "ecc_uncorrected_volatile",
            {"type": "uncorrected", "scope": "volatile"},
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            event=True,
            health="memory",
            dcgm_help="Double-bit volatile ECC errors",
        ),
        Variant(
            "ecc_corrected_aggregate",
            {"type": "corrected", "scope": "aggregate"},
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "Single-bit persistent ECC errors",
        ),
        Variant(
            "ecc_uncorrected_aggregate",
            {"type": "uncorrected", "scope": "aggregate"},
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            event=True,
            dcgm_help="Double-bit persistent ECC errors",
        ),
        dcgm_type="counter",
        dcgm_unit="count",
    ),
    *family(
        "gpu_remapped_rows_total",
        "counter",
        "Memory rows remapped, by the kind of error that caused it.",
        "ecc",
        Variant(
            "remapped_rows_correctable",
            {"type": "correctable"},
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "Rows remapped for correctable errors",
        ),
        Variant(
            "remapped_rows_uncorrectable",
            {"type": "uncorrectable"},
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            event=True,
            dcgm_help="Rows remapped for uncorrectable errors",
        ),
        dcgm_type="counter",
        dcgm_unit="count",
    ),
    entry(
        "remapped_rows_pending",
        "gpu_remapped_rows_pending",
        "gauge",
        "1 when a row remapping is pending (takes effect after a GPU reset).",
        "ecc",
        health="memory",
    ),
    entry(
        "remapped_rows_failure",
        "gpu_remapped_rows_failed",
        "gauge",
        "1 when a row remapping has failed (the GPU needs service).",
        "ecc",
        dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE",
        event=True,
        health="memory",
        dcgm_unit="bool",
        dcgm_help="Whether remapping of rows has failed",
    ),
    *family(
        "gpu_retired_pages",
        "gauge",
        "Memory pages retired, by cause.",
        "ecc",
        Variant(
            "retired_pages_sbe",
            {"cause": "multiple_single_bit"},
            "DCGM_FI_DEV_RETIRED_SBE",
            "Pages retired for single-bit errors",
            health="memory",
        ),
        Variant(
            "retired_pages_dbe",
            {"cause": "double_bit"},
            "DCGM_FI_DEV_RETIRED_DBE",
            "Pages retired for double-bit errors",
            health="memory",
        ),
        dcgm_unit="count",
    ),
    # nvlink
    entry(
        "nvlink_tx",
        "gpu_nvlink_transmitted_bytes_total",
        "counter",
        "NVLink data bytes sent, by link.",
        "nvlink",
        labels=("link",),
    ),
    entry(
        "nvlink_rx",
        "gpu_nvlink_received_bytes_total",
        "counter",
        "NVLink data bytes received, by link.",
        "nvlink",
        labels=("link",),
    ),
    # processes
    entry("processes", "gpu_processes", "gauge", "Compute processes running on the device.", "processes"),
    entry(
        "processes_memory",
        "gpu_processes_memory_used_bytes",
        "gauge",
        "Device memory used by compute processes, in bytes (where the driver reports it).",
        "processes",
    ),
    # gpm (Hopper and newer)
    *(
        entry(key, name, "gauge", help_, "gpm", dcgm=dcgm, dcgm_unit="ratio", dcgm_help=dcgm_help)
        for key, name, help_, dcgm, dcgm_help in (
            (
                "sm_active",
                "gpu_sm_active_ratio",
                "Fraction of time at least one warp was active on an SM, averaged over SMs (0-1).",
                "DCGM_FI_PROF_SM_ACTIVE",
                "Ratio of cycles an SM has at least one warp assigned",
            ),
            (
                "sm_occupancy",
                "gpu_sm_occupancy_ratio",
                "Resident warps as a fraction of the theoretical maximum, averaged over SMs (0-1).",
                "DCGM_FI_PROF_SM_OCCUPANCY",
                "Ratio of resident warps to the maximum on an SM",
            ),
            (
                "tensor_active",
                "gpu_tensor_active_ratio",
                "Fraction of cycles a tensor pipe was active (0-1).",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                "Ratio of cycles the tensor pipe is active",
            ),
            (
                "dram_active",
                "gpu_dram_active_ratio",
                "Device memory bandwidth used as a fraction of its peak (0-1).",
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "Ratio of cycles the device memory interface is active",
            ),
        )
    ),
    *family(
        "gpu_pipe_active_ratio",
        "gauge",
        "Fraction of cycles a math pipe was active (0-1).",
        "gpm",
        *(
            Variant(
                f"{pipe}_active",
                {"pipe": pipe},
                f"DCGM_FI_PROF_PIPE_{pipe.upper()}_ACTIVE",
                f"Ratio of cycles the {pipe} pipe is active",
            )
            for pipe in ("fp64", "fp32", "fp16")
        ),
        dcgm_unit="ratio",
    ),
    # xid
    entry(
        "xid_errors",
        "gpu_xid_errors_total",
        "counter",
        "XID errors reported by the driver since the agent started, by XID code.",
        "xid",
        labels=("xid",),
        event=True,
        health="xid",
    ),
    # per-pod attribution (k8s/): produced by the attributor, forwarded with the device's values
    *(entry(key, name, type_, help_, "processes", labels=POD_LABELS) for key, name, type_, help_ in _POD),
    # per-process series (opt-in, --processes.series): the top processes by memory on each GPU
    entry(
        "process_memory",
        "gpu_process_memory_used_bytes",
        "gauge",
        "Device memory used by the process, in bytes (the top processes by memory of each GPU).",
        "processes",
        labels=PROCESS_LABELS,
    ),
    entry(
        "process_utilization",
        "gpu_process_utilization_ratio",
        "gauge",
        "SM utilization of the process in the last period (0-1).",
        "processes",
        labels=PROCESS_LABELS,
    ),
    # --- GPU health at a glance: throttle time, the health summary, the last XID ---
    *family(
        "gpu_clock_event_seconds_total",
        "counter",
        "Seconds the clocks were held down, by cause (NVIDIA: since the driver loaded; AMD: since the agent started).",
        "clocks",
        *(
            Variant(
                f"clock_event_seconds_{reason}",
                {"reason": reason},
                f"DCGM_FI_DEV_{field}_VIOLATION",
                f"Throttling duration due to {cause}",
                health=role,
            )
            for reason, field, cause, role in (
                ("power", "POWER", "power constraints", "power"),
                ("thermal", "THERMAL", "thermal constraints", "thermal"),
                ("sync_boost", "SYNC_BOOST", "sync-boost constraints", ""),
                ("board_limit", "BOARD_LIMIT", "board limit constraints", ""),
                ("low_utilization", "LOW_UTIL", "low utilization", ""),
                ("reliability", "RELIABILITY", "reliability constraints", ""),
            )
        ),
        scale=1e6,
        dcgm_type="counter",
        dcgm_unit="us",
    ),
    entry(
        "health",
        "gpu_health",
        "gauge",
        "Health by subsystem: 0 ok, 1 warning, 2 failure (rules in docs/health.md).",
        "health",
        labels=("subsystem",),
    ),
    entry(
        "xid_last",
        "gpu_xid_last_code",
        "gauge",
        "Code of the most recent XID error since the agent started, 0 when none (gpu_xid_errors_total counts them).",
        "xid",
        dcgm="DCGM_FI_DEV_XID_ERRORS",
        health="xid",
        dcgm_unit="xid",
        dcgm_help="Value of the last XID error encountered",
    ),
)
