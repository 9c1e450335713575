"""Which GPU or MIG device a DRA claim device is, without the API server.

The kubelet names a claim's device by driver, pool and device name (``gpu-0``) and by the CDI devices
it injected. The CDI specs on the node (``cdi.py``) say which device nodes, and so which GPU minor and
MIG instances, or which UUIDs, each CDI device gives the container; the samples say which minor each
GPU has (the ``device`` info, ``nvidia<minor>``). A MIG device made for the claim (dynamic MIG) is
matched by its parent's minor and its GPU and compute instance IDs, whatever its UUID. A device no spec
resolves is looked up in the ResourceSlices where that is enabled (``slices.py``); failing that, a
device of NVIDIA's driver named ``gpu-<minor>`` is still that GPU.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpu_exporter.k8s import cdi
from gpu_exporter.k8s.podresources import ClaimDevice, device_matches
from gpu_exporter.k8s.slices import ResourceSlices
from gpu_exporter.model import DeviceId, DeviceSample

__all__ = ["ClaimResolver", "Target"]

NVIDIA_DRIVER = "gpu.nvidia.com"
_GPU_NAME = re.compile(r"^gpu-(\d+)$")
_RESCAN_EVERY = 1.0  # seconds: an unknown CDI device re-reads the specs at most this often


@dataclass(frozen=True, slots=True)
class Target:
    """A device as a claim names it: by UUID, by GPU minor, or by parent minor and MIG instance IDs."""

    uuid: str = ""
    minor: int | None = None
    gpu_instance: int | None = None  # set for a MIG device
    compute_instance: int | None = None  # None: any compute instance of that GPU instance

    def matches(self, device: DeviceId, minor: int | None) -> bool:
        if self.uuid:
            return device_matches(self.uuid, device)
        if self.minor is None or minor != self.minor:
            return False
        if self.gpu_instance is None:
            return not device.is_mig
        if not device.is_mig or device.gpu_instance != str(self.gpu_instance):
            return False
        return self.compute_instance is None or device.compute_instance == str(self.compute_instance)


def minor_of(sample: DeviceSample) -> int | None:
    """The GPU minor (``/dev/nvidia<minor>``; a MIG instance's parent's) from the ``device`` info."""
    name = sample.info.get("device", "")
    return int(name[6:]) if name.startswith("nvidia") and name[6:].isdigit() else None


@dataclass
class ClaimResolver:
    """Resolves claim devices to targets, re-reading the CDI specs when one names an unknown device."""

    cdi_dirs: tuple[str, ...]
    procfs: str
    refresh: float = 10.0
    clock: Callable[[], float] = time.monotonic
    slices: ResourceSlices | None = None
    _index: cdi.CdiIndex = field(default_factory=cdi.CdiIndex)
    _mig: cdi.MigMinors = field(default_factory=cdi.MigMinors)
    _scanned_at: float = float("-inf")

    def _rescan(self, claims: Sequence[ClaimDevice]) -> None:
        now = self.clock()
        unknown = any(name not in self._index.devices for c in claims for name in c.cdi_devices)
        if now - self._scanned_at >= self.refresh or (unknown and now - self._scanned_at >= _RESCAN_EVERY):
            self._index = cdi.scan(self.cdi_dirs)
            self._mig = cdi.read_mig_minors(self.procfs)
            self._scanned_at = now

    @property
    def rejected_specs(self) -> int:
        return self._index.rejected

    def _from_cdi(self, device: cdi.CdiDevice) -> list[Target]:
        if device.uuids:
            return [Target(uuid=u) for u in device.uuids]
        if device.caps:
            instances = [self._mig.by_minor[c] for c in device.caps if c in self._mig.by_minor]
            # the compute instance's node names all three; the GPU instance's alone names only two
            full = [i for i in instances if i[2] is not None] or instances
            return [Target(minor=gpu, gpu_instance=gi, compute_instance=ci) for gpu, gi, ci in full[:1]]
        return [Target(minor=m) for m in device.minors]

    def targets(self, claim: ClaimDevice) -> list[Target]:
        """The devices one claim device gives its container ([] when nothing says which)."""
        out: list[Target] = []
        for name in claim.cdi_devices:
            found = self._index.devices.get(name)
            if found is not None:
                out.extend(t for t in self._from_cdi(found) if t not in out)
        if not out and self.slices is not None and (uuid := self.slices.uuid(claim.driver, claim.pool, claim.device)):
            out.append(Target(uuid=uuid))
        if not out and claim.driver == NVIDIA_DRIVER and (match := _GPU_NAME.match(claim.device)):
            out.append(Target(minor=int(match.group(1))))
        return out

    def resolve(self, claims: Sequence[ClaimDevice]) -> list[tuple[ClaimDevice, list[Target]]]:
        """Each claim device with its targets ([] where nothing says which device it is)."""
        if not claims:
            return []
        self._rescan(claims)
        if self.slices is not None and any(not self._from_specs(claim) for claim in claims):
            self.slices.refresh()
        return [(claim, self.targets(claim)) for claim in claims]

    def _from_specs(self, claim: ClaimDevice) -> bool:
        return any(
            name in self._index.devices and self._from_cdi(self._index.devices[name]) for name in claim.cdi_devices
        )
