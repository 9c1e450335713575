"""The small value types shared by the attribution modules."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.limits import bound_value

__all__ = ["PodRef"]


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
