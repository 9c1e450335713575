"""Catalog entries that only some vendors report (AMD, Jetson); new vendor-specific entries go here."""

from __future__ import annotations

from gpu_exporter.catalog.metric import CLOCK_HELP, MAXCLOCK_HELP, Metric, entry

METRICS: tuple[Metric, ...] = (
    entry(
        "multimedia_utilization",
        "gpu_multimedia_utilization_ratio",
        "gauge",
        "Multimedia (video codec) engine activity, AMD (0-1).",
        "utilization",
    ),
    entry("clock_soc", "gpu_clock_hertz", "gauge", CLOCK_HELP, "clocks", {"clock": "soc"}),
    entry("clock_max_soc", "gpu_clock_max_hertz", "gauge", MAXCLOCK_HELP, "clocks", {"clock": "soc"}),
    entry(
        "clock_min_graphics",
        "gpu_clock_min_hertz",
        "gauge",
        "Lowest clock frequency the governor may choose, in hertz, by clock domain (Jetson).",
        "clocks",
        {"clock": "graphics"},
    ),
    entry(
        "frequency_governor",
        "gpu_frequency_governor",
        "gauge",
        "1 for the devfreq governor that sets the GPU clock (Jetson).",
        "clocks",
        labels=("governor",),
    ),
    entry(
        "pcie_bandwidth",
        "gpu_pcie_bandwidth_bytes_per_second",
        "gauge",
        "PCIe bandwidth in use, both directions together, in bytes per second (AMD).",
        "pcie",
    ),
    entry(
        "ecc_block_corrected",
        "gpu_ecc_block_errors_total",
        "counter",
        "ECC errors by hardware block and type since the driver was loaded (AMD).",
        "ecc",
        {"type": "corrected"},
        labels=("block",),
    ),
    entry(
        "ecc_block_uncorrected",
        "gpu_ecc_block_errors_total",
        "counter",
        "ECC errors by hardware block and type since the driver was loaded (AMD).",
        "ecc",
        {"type": "uncorrected"},
        labels=("block",),
        event=True,
    ),
    entry(
        "board_power",
        "gpu_board_input_power_watts",
        "gauge",
        "Power drawn by the whole module at its input rail, in watts (Jetson).",
        "power",
    ),
    entry(
        "power_rail",
        "gpu_power_rail_watts",
        "gauge",
        "Power on each monitored supply rail, in watts (Jetson INA3221; a rail may feed more than the GPU).",
        "power",
        labels=("rail",),
    ),
)
