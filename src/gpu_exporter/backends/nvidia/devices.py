"""What the NVML backend keeps per GPU and per MIG instance, and the NVML ids it reads by number."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.backends._calls import Liveness
from gpu_exporter.model import DeviceId, SeriesKey

__all__ = [
    "CLOCKS",
    "FI_MEMORY_TEMP",
    "FI_NVLINK_LINK_COUNT",
    "FI_NVLINK_RX",
    "FI_NVLINK_TX",
    "MIG_PROFILE",
    "Device",
    "Mig",
    "text",
]

CLOCKS = (("graphics", 0), ("sm", 1), ("memory", 2), ("video", 3))  # NVML_CLOCK_* values
FI_MEMORY_TEMP = 82
FI_NVLINK_LINK_COUNT = 91
FI_NVLINK_TX = 138
FI_NVLINK_RX = 139
MIG_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)", re.IGNORECASE)


def text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@dataclass
class Mig:
    handle: Any
    id: DeviceId
    scope: str  # key for the "not supported" cache and logs, e.g. "0/mig3"


@dataclass
class Device:
    index: int
    handle: Any = None
    id: DeviceId = field(default_factory=lambda: DeviceId("", ""))
    info: dict[str, str] = field(default_factory=dict)
    static: dict[SeriesKey, float] = field(default_factory=dict)  # values read once (max clocks)
    live: Liveness = field(default_factory=Liveness)
    migs: list[Mig] = field(default_factory=list)
    migs_at: float = float("-inf")  # when the MIG devices were last listed (they come and go: DRA makes them)
    nvlinks: int = 0
    gpm: bool = False
    gpm_samples: list[Any] = field(default_factory=list)
    gpm_primed: bool = False
    last_process_ts: int = 0

    @functools.cached_property
    def scope(self) -> str:  # (the index never changes)
        return str(self.index)
