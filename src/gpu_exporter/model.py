"""The data that flows from a backend to the ring buffer, the exposition and the forwarder.

A sample is immutable once built: readers on other threads share it without copying.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["DeviceId", "DeviceSample", "ProcessUsage", "Sample", "SeriesKey"]

# (catalog key, values of the metric's dynamic labels in catalog order)
SeriesKey = tuple[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class DeviceId:
    """Identity labels of one GPU or one MIG instance."""

    gpu: str
    uuid: str
    gpu_instance: str = ""
    compute_instance: str = ""
    mig_profile: str = ""
    parent_uuid: str = ""

    @property
    def is_mig(self) -> bool:
        return bool(self.parent_uuid)

    def labels(self) -> tuple[tuple[str, str], ...]:
        """Label pairs in a fixed order; MIG labels only for MIG instances."""
        pairs: tuple[tuple[str, str], ...] = (("gpu", self.gpu), ("uuid", self.uuid))
        if self.is_mig:
            pairs += (
                ("gpu_instance", self.gpu_instance),
                ("compute_instance", self.compute_instance),
                ("mig_profile", self.mig_profile),
                ("parent_uuid", self.parent_uuid),
            )
        return pairs


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """A compute process on a device, as the vendor library reports it (for pod attribution)."""

    pid: int
    memory_bytes: float | None = None  # None when the driver does not say
    sm_ratio: float | None = None  # share of SM time in the last period, 0-1


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One device's readings in one collect cycle.

    ``values`` holds only what the device reported: unsupported readings are absent, never 0.
    ``info`` carries identity strings (name, serial, driver...) for ``gpu_info``.
    """

    device: DeviceId
    up: bool
    values: dict[SeriesKey, float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    processes: tuple[ProcessUsage, ...] = ()


@dataclass(frozen=True, slots=True)
class Sample:
    """All devices of one collect cycle, numbered per boot of the agent."""

    seq: int
    timestamp: float  # wall clock, seconds since the epoch, taken at the start of the cycle
    devices: tuple[DeviceSample, ...]
    duration: float = 0.0  # seconds the backend took
