"""Pod attribution: which Kubernetes pod uses which GPU, how much of it, and how much energy.

Computed on a background thread from the samples in the ring (never on the scrape path), from two
sources: the kubelet's pod-resources API where its socket exists (device-plugin devices, and DRA claims
resolved offline through the node's CDI specs), and a fallback that also works on KubeEdge (whose
EdgeCore creates no such socket): GPU process IDs from the driver, their ``/proc/<pid>/cgroup`` to pod
UID and container ID, and names from the kubelet's log directories.

``PodAttributor`` and ``PodRef`` are imported on first use: the configuration imports this package's
``options`` at every start, which must not cost prometheus_client nor run into ``config`` half-built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_exporter import lazy

if TYPE_CHECKING:
    from gpu_exporter.k8s.attribution import PodAttributor
    from gpu_exporter.k8s.model import PodRef

__all__ = ["PodAttributor", "PodRef"]

_LAZY = {"PodAttributor": "gpu_exporter.k8s.attribution", "PodRef": "gpu_exporter.k8s.model"}


__getattr__ = lazy.exports(globals(), _LAZY)
