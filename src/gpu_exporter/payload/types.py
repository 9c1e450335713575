"""The batch payload's types and the format's constants (docs/payload.md): what a batch holds, what
``peek`` reads of it, and the limits both the encoder and the decoders apply."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from gpu_exporter.model import DeviceId, Sample

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT",
    "MAX_SCALE",
    "MAX_TEXT",
    "VERSION",
    "VERSIONS",
    "Batch",
    "Header",
    "HealthValue",
    "PayloadError",
    "Point",
]

FORMAT = "gpu-exporter.batch"
VERSION = 3  # what encode writes; decode reads this and every earlier version in VERSIONS
VERSIONS = (1, 2, 3)
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # compressed input and inflated JSON, each
MAX_SCALE = 9  # decimal places a delta column may carry
SAFE_INT = 2**53  # beyond this JSON numbers stop being exact in most readers
GZIP_MAGIC = b"\x1f\x8b"
KEY = re.compile(r"^[a-z][a-z0-9_]*$")
SUMMARY_KEY = re.compile(r"^[a-z][a-z0-9_]*:(min|max|mean|last)$")  # in a summary batch (summary_ms set)
MAX_WINDOW_MS = 366 * 86400 * 1000
PART = re.compile(r"^[0-9a-f]{16}$")  # a part's name (payload/split.py): 8 bytes of a hash, in hex
MAX_TEXT = 1024  # longest label value, node name, boot id, info value we accept
ID_FIELDS = ("gpu", "uuid", "gpu_instance", "compute_instance", "mig_profile", "parent_uuid")
HAS_STEP = 20  # added to a delta array's form when a step follows it
# A health report (payload/health.py): the agent's own metrics, as on its page
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_HEALTH = 1024  # values in one health report
MAX_HEALTH_LABELS = 32  # labels of one of its values


class PayloadError(ValueError):
    """A payload that is not a valid batch; the message is one line."""


class HealthValue(NamedTuple):
    """One value of a health report: a metric of the agent's own page, by its name there (a counter's with
    ``_total``), its labels, and its value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive samples of one agent boot, as forwarded together.

    Sequence numbers increase strictly but may have gaps (samples the ring overwrote before they were
    forwarded). Decoded samples carry ``up``, ``values`` and ``info`` of each device; ``processes`` and
    ``duration`` do not travel, and timestamps are whole milliseconds.
    """

    node: str
    boot: str
    samples: tuple[Sample, ...]
    summary_ms: int = 0  # a summary batch (forward/summary.py): its window in ms; 0 for full resolution
    part: str = ""  # some devices (or series) of its samples only (payload/split.py): its name; "" for all
    # a health report (payload/health.py): the agent's own metrics; its one sample has no devices and the
    # report's own sequence number
    health: tuple[HealthValue, ...] = ()

    @property
    def first_seq(self) -> int:
        return self.samples[0].seq

    @property
    def last_seq(self) -> int:
        return self.samples[-1].seq

    def points(self) -> Iterator[Point]:
        """Every value of the batch, sample by sample (what a remote-write sender needs)."""
        for sample in self.samples:
            ts_ms = round(sample.timestamp * 1000)
            for dev in sample.devices:
                for (key, labels), value in dev.values.items():
                    yield Point(dev.device, key, labels, ts_ms, value, sample.seq)

    def device_states(self) -> Iterator[tuple[DeviceId, int, bool, int]]:
        """(device, timestamp in ms, up, seq) for every device in every sample."""
        for sample in self.samples:
            ts_ms = round(sample.timestamp * 1000)
            for dev in sample.devices:
                yield dev.device, ts_ms, dev.up, sample.seq


class Header(NamedTuple):
    """What ``peek`` reads: who sent the batch and which samples it holds."""

    node: str
    boot: str
    seqs: tuple[int, ...]
    times_ms: tuple[int, ...]
    version: int = VERSION
    summary_ms: int = 0
    part: str = ""

    @property
    def first_seq(self) -> int:
        return self.seqs[0]

    @property
    def last_seq(self) -> int:
        return self.seqs[-1]


class Point(NamedTuple):
    """One value: ``device.labels()`` gives the identity labels, ``key`` the catalog entry
    (``gpu_exporter.catalog.by_key``), ``labels`` the values of that entry's dynamic labels in order."""

    device: DeviceId
    key: str
    labels: tuple[str, ...]
    timestamp_ms: int
    value: float
    seq: int
