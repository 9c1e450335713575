"""The small value types shared by the attribution modules."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.limits import bound_value

__all__ = ["PodRef", "PodShare"]


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A container of a pod, by the names Kubernetes users know it by."""

    namespace: str
    pod: str
    container: str = ""

    def labels(self) -> tuple[tuple[str, str], ...]:
        """Label pairs, each value bounded as every label value the agent serves (``limits.py``)."""
        return (
            ("namespace", bound_value(self.namespace)),
            ("pod", bound_value(self.pod)),
            ("container", bound_value(self.container)),
        )


@dataclass(frozen=True, slots=True)
class PodShare:
    """One container's part of a device in the newest sample, for views that split a shared GPU by pod."""

    pod: PodRef
    uid: str = ""
    vgpu: str = ""  # the time-slicing replica the device plugin gave it (``<id>::<n>``), "" for none
    memory: float = 0.0  # bytes of its processes (0 for an idle holder)
    sm: float = 0.0  # summed SM utilization of its processes, 0-1
