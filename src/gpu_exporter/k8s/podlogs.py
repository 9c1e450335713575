"""Pod and container names from the kubelet's log directories.

The kubelet (and KubeEdge's EdgeCore, which embeds it) writes each container's log under
``/var/log/pods/<namespace>_<pod>_<pod uid>/<container>/<restart>.log`` and links it from
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``. Namespaces, pod and
container names are DNS labels, so they contain no ``_``: the names split cleanly. Only directory
entries are read, never log contents.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["PodDirectory", "scan"]

_LINK = re.compile(r"^([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True)
class PodDirectory:
    """What the log directories say about the pods on this node."""

    # pod uid -> (namespace, pod, container names)
    pods: dict[str, tuple[str, str, tuple[str, ...]]] = field(default_factory=dict)
    # container id -> (namespace, pod, container name)
    containers: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # (namespace, pod) -> pod uid, for pods the kubelet names without their UID
    uids: dict[tuple[str, str], str] = field(default_factory=dict)

    def names(self, pod_uid: str, container_id: str) -> tuple[str, str, str] | None:
        """(namespace, pod, container) for a pod UID and container ID; None for an unknown pod."""
        pod = self.pods.get(pod_uid)
        if pod is None:
            return None
        namespace, name, containers = pod
        known = self.containers.get(container_id)
        if known is not None and known[:2] == (namespace, name):
            return namespace, name, known[2]
        # Without the link, a pod with a single container still names it unambiguously.
        return namespace, name, containers[0] if len(containers) == 1 else ""


def _listdir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError:
        return []


def scan(pods_path: str | Path, containers_path: str | Path | None = None) -> PodDirectory:
    """Index ``pods_path`` (default layout ``/var/log/pods``) and its sibling ``containers``."""
    pods_path = Path(pods_path)
    containers_path = Path(containers_path) if containers_path else pods_path.parent / "containers"
    pods: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for entry in _listdir(pods_path):
        parts = entry.name.split("_")
        if len(parts) != 3 or not entry.is_dir():
            continue
        namespace, pod, uid = parts
        containers = tuple(sorted(e.name for e in _listdir(Path(entry.path)) if e.is_dir()))
        pods[uid] = (namespace, pod, containers)
    by_id: dict[str, tuple[str, str, str]] = {}
    for entry in _listdir(containers_path):
        match = _LINK.match(entry.name)
        if match:
            pod, namespace, container, container_id = match.groups()
            by_id[container_id] = (namespace, pod, container)
    uids = {(namespace, pod): uid for uid, (namespace, pod, _) in pods.items()}
    return PodDirectory(pods, by_id, uids)
