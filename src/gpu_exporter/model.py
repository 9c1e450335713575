"""The data that flows from a backend to the ring buffer, the exposition and the forwarder.

A sample is immutable once built: readers on other threads share it without copying.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DeviceId", "DeviceSample", "ProcessUsage", "Readings", "Sample", "SeriesKey"]

# (catalog key, values of the metric's dynamic labels in catalog order)
SeriesKey = tuple[str, tuple[str, ...]]


class _Schema:
    """The ordered series keys of a device, shared by every sample in which they are the same."""

    __slots__ = ("index", "keys", "memo", "packing")

    def __init__(self, keys: tuple[SeriesKey, ...]) -> None:
        self.keys = keys
        self.index = {key: i for i, key in enumerate(keys)}
        self.packing = struct.Struct(f"={len(keys)}d")  # the values as doubles, native order, no padding
        self.memo: dict[str, Any] = {}  # what readers work out from the keys alone (Readings.memo)


_DOUBLE = struct.Struct("=d")


_SCHEMAS: dict[tuple[SeriesKey, ...], _Schema] = {}
_SCHEMAS_MAX = 4096  # distinct key sets seen; far more than any node has devices and variants


def _schema(keys: tuple[SeriesKey, ...]) -> _Schema:
    found = _SCHEMAS.get(keys)
    if found is None:
        if len(_SCHEMAS) >= _SCHEMAS_MAX:
            _SCHEMAS.clear()
        found = _SCHEMAS[keys] = _Schema(keys)
    return found


class Readings(Mapping[SeriesKey, float]):
    """A device's values in one sample: a read-only mapping stored as shared keys and packed doubles.

    The ring keeps ``--metrics-buffer-size`` samples and the forwarder's open batch its own rounded copies;
    as dicts of tuples and floats a sample of 8 GPUs took about 150 KB. The values are one ``bytes`` object
    of doubles (8 bytes a value plus 33): an ``array`` took one more object and grew its buffer past the
    values (about 100 bytes more a device).
    """

    __slots__ = ("_schema", "_values")

    def __init__(self, data: Mapping[SeriesKey, float] | None = None) -> None:
        data = data or {}
        self._schema = _schema(tuple(data))
        self._values = self._schema.packing.pack(*data.values())

    def __getitem__(self, key: SeriesKey) -> float:
        value: float = _DOUBLE.unpack_from(self._values, 8 * self._schema.index[key])[0]
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._schema.index

    def __iter__(self) -> Iterator[SeriesKey]:
        return iter(self._schema.keys)

    def __len__(self) -> int:
        return len(self._schema.keys)

    def items(self) -> Iterator[tuple[SeriesKey, float]]:  # type: ignore[override]
        return zip(self._schema.keys, self._schema.packing.unpack(self._values), strict=True)

    @property
    def keys_tuple(self) -> tuple[SeriesKey, ...]:
        """The keys in order: one object shared by every Readings with the same keys."""
        return self._schema.keys

    def numbers(self) -> tuple[float, ...]:
        """The values in the order of ``keys_tuple``."""
        return self._schema.packing.unpack(self._values)

    @property
    def memo(self) -> dict[str, Any]:
        """A dict shared by every Readings with the same keys in the same order, for what a reader works
        out from the keys alone (which are counters, whether a label needs bounding) once per key set
        instead of once per value and cycle. Each reader keeps its entry under a name of its own."""
        return self._schema.memo

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Readings({dict(self.items())!r})"


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

    def fields(self) -> tuple[str, str, str, str, str, str]:
        """Every identity field, in declaration order (MIG ones empty for a whole GPU)."""
        return (self.gpu, self.uuid, self.gpu_instance, self.compute_instance, self.mig_profile, self.parent_uuid)

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
    values: Mapping[SeriesKey, float] = field(default_factory=Readings)
    info: dict[str, str] = field(default_factory=dict)
    processes: tuple[ProcessUsage, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.values, Readings):
            object.__setattr__(self, "values", Readings(self.values))


@dataclass(frozen=True, slots=True)
class Sample:
    """All devices of one collect cycle, numbered per boot of the agent."""

    seq: int
    timestamp: float  # wall clock, seconds since the epoch, taken at the start of the cycle
    devices: tuple[DeviceSample, ...]
    duration: float = 0.0  # seconds the backend took
