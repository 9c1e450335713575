"""Which containers the kubelet says hold each device: device-plugin devices and DRA claim devices.

The pod-resources List is asked once per ``k8s.refresh-interval`` and its answer kept until the next
(with 50,000 pods a List costs more than a core when asked at every sample); a refused or failing
kubelet is asked again only after that interval too, and meanwhile the /proc source carries on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable

from gpu_exporter.k8s.dra import ClaimResolver, Target, minor_of
from gpu_exporter.k8s.model import PodRef
from gpu_exporter.k8s.podresources import PodResources, PodResourcesError, device_matches, list_pod_resources
from gpu_exporter.model import DeviceSample

__all__ = ["KubeletHolders"]

log = logging.getLogger(__name__)


class KubeletHolders:
    def __init__(
        self,
        socket_path: str,
        refresh: float,
        resolver: ClaimResolver,
        lister: Callable[[str], PodResources] | None = None,
        count: Callable[[str], None] = lambda source: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._socket = socket_path
        self._refresh = refresh
        self._resolver = resolver
        self._lister = lister or list_pod_resources
        self._count = count
        self._clock = clock
        self._asked_at = float("-inf")
        self._resources = PodResources()
        self._claims: list[tuple[PodRef, list[Target]]] = []
        self._reported: set[str] = set()  # failure kinds said (a gRPC status each): a handful at most

    def refresh(self) -> None:
        """Ask the kubelet if the last answer is older than the refresh interval; resolve DRA claims."""
        now = self._clock()
        if now - self._asked_at >= self._refresh:
            self._asked_at = now
            self._resources = self._ask()
        self._claims = [(claim.pod, targets) for claim, targets in self._resolver.resolve(self._resources.claims)]

    def _ask(self) -> PodResources:
        if not os.path.exists(self._socket):
            return PodResources()
        try:
            return self._lister(self._socket)
        except PodResourcesError as exc:
            # e.g. a non-root agent may not connect to the root-owned socket
            self._count("pod_resources")
            # once per kind of failure, not per text: a kubelet whose every error differs (a timestamp, a
            # request id in it) would otherwise fill the log and this memory without end
            if exc.kind not in self._reported:
                self._reported.add(exc.kind)
                log.warning("%s; using /proc for pod attribution", exc)
            return PodResources()

    def held(self, sample: DeviceSample, minor: int | None = None) -> set[PodRef]:
        """The containers the kubelet lists as holding this device (GPU or MIG instance)."""
        device = sample.device
        if minor is None:
            minor = minor_of(sample)
        out = {a.pod for a in self._resources.devices if device_matches(a.device_id, device)}
        out.update(pod for pod, targets in self._claims if any(t.matches(device, minor) for t in targets))
        return out

    def replicas(self, sample: DeviceSample) -> dict[PodRef, str]:
        """The time-slicing replica (``<id>::<n>``: n) each container holds of this device."""
        return {
            a.pod: a.device_id.split("::", 1)[1]
            for a in self._resources.devices
            if "::" in a.device_id and device_matches(a.device_id, sample.device)
        }

    def claim_devices(self, devices: Iterable[DeviceSample]) -> tuple[int, int]:
        """(matched, unmatched): the claim devices of the last List that name a device of ``devices``, and
        those that name none (another driver's device, a spec not readable, a MIG device not seen yet)."""
        found = [(d.device, minor_of(d)) for d in devices]
        matched = sum(1 for _, targets in self._claims if any(t.matches(d, m) for t in targets for d, m in found))
        return matched, len(self._claims) - matched
