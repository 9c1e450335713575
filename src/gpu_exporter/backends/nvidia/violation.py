"""Throttle time per cause from NVML's violation counters (``nvmlDeviceGetViolationStatus``).

The driver accumulates, per performance policy, the nanoseconds during which that policy held the
clocks below what was asked (since the driver loaded). Served as
``gpu_clock_event_seconds_total{reason}``: unlike the 0/1 clock-event reasons read at the sample
instant, a counter also records throttling that began and ended between two samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_exporter.model import SeriesKey

__all__ = ["VIOLATION_POLICIES", "read_violations"]

# NVML_PERF_POLICY_* value -> reason label (and catalog key suffix)
VIOLATION_POLICIES = (
    (0, "power"),
    (1, "thermal"),
    (2, "sync_boost"),
    (3, "board_limit"),
    (4, "low_utilization"),
    (5, "reliability"),
)


def read_violations(call: Callable[..., Any], handle: Any, values: dict[SeriesKey, float]) -> None:
    """``call(name, *args, variant=...)`` is the backend's guarded call for one device."""
    for policy, reason in VIOLATION_POLICIES:
        status = call("nvmlDeviceGetViolationStatus", handle, policy, variant=reason)
        if status is not None:
            values[(f"clock_event_seconds_{reason}", ())] = int(status.violationTime) * 1e-9
