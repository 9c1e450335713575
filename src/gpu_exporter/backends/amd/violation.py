"""Throttle time per cause on AMD GPUs, from ``amdsmi_get_violation_status``.

The firmware does not count time: it counts samples. ``acc_counter`` grows by one per firmware sample,
and ``acc_ppt_pwr`` (package power tracking, PVIOL) and ``acc_socket_thrm`` (socket thermal, TVIOL) by
one per sample in which that limit held the clocks down. Between two reads, the share of held-down
samples times the time between the reads is the time spent throttled; summed over reads it is the same
``gpu_clock_event_seconds_total{reason}`` counter as on NVIDIA, counted from the agent's start.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VIOLATION_FIELDS", "ViolationTime"]

# amdsmi_get_violation_status field -> reason label (catalog key clock_event_seconds_<reason>)
VIOLATION_FIELDS = (("acc_ppt_pwr", "power"), ("acc_socket_thrm", "thermal"))


def _count(value: Any) -> int | None:
    """A counter field; the package turns max-int sentinels into "N/A"."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class ViolationTime:
    """Seconds throttled per reason for one card, accumulated read after read."""

    def __init__(self) -> None:
        self._last: tuple[float, int, dict[str, int]] | None = None
        self.seconds: dict[str, float] = {}

    def update(self, status: Any, now: float) -> dict[str, float]:
        """Fold one reading in; returns the totals of the reasons the card reports."""
        if not isinstance(status, dict):
            return {}
        samples = _count(status.get("acc_counter"))
        counts = {reason: c for key, reason in VIOLATION_FIELDS if (c := _count(status.get(key))) is not None}
        if samples is None or not counts:
            return {}
        for reason in counts:
            self.seconds.setdefault(reason, 0.0)
        last = self._last
        if last is not None:
            then, then_samples, then_counts = last
            elapsed, taken = now - then, samples - then_samples
            if elapsed > 0 and taken > 0:  # taken <= 0: no new firmware sample, or the counters restarted
                for reason, count in counts.items():
                    held = count - then_counts.get(reason, count)
                    if 0 <= held <= taken:
                        self.seconds[reason] += elapsed * held / taken
        self._last = (now, samples, counts)
        return {reason: self.seconds[reason] for reason in counts}
