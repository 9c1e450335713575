"""The small value types shared by the attribution modules."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PodRef"]


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A container of a pod, by the names Kubernetes users know it by."""

    namespace: str
    pod: str
    container: str = ""

    def labels(self) -> tuple[tuple[str, str], ...]:
        return (("namespace", self.namespace), ("pod", self.pod), ("container", self.container))
