"""Pod attribution: which Kubernetes pod uses which GPU, how much of it, and how much energy.

Computed on a background thread from the samples in the ring (never on the scrape path), from two
sources: the kubelet's pod-resources API where its socket exists, and a fallback that also works on
KubeEdge (whose EdgeCore creates no such socket): GPU process IDs from the driver, their
``/proc/<pid>/cgroup`` to pod UID and container ID, and names from the kubelet's log directories.
"""

from gpu_exporter.k8s.attribution import PodAttributor
from gpu_exporter.k8s.model import PodRef

__all__ = ["PodAttributor", "PodRef"]
