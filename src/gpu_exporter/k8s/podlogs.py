"""Pod and container names from the kubelet's log directories.

The kubelet (and KubeEdge's EdgeCore, which embeds it) writes each container's log under
``/var/log/pods/<namespace>_<pod>_<pod uid>/<container>/<restart>.log`` and links it from
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``. Namespaces, pod and
container names are DNS labels, so they contain no ``_``: the names split cleanly. Only directory
entries are read, never log contents.

A scan reads the two directories' entries only, at most ``MAX_ENTRIES`` of each (a node keeps the
directories of deleted pods until the kubelet's garbage collection: 100,000 of them were a core's
work at every scan when each pod's own directory was listed too). A pod's container directories are
listed when a name is first asked of it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MAX_ENTRIES", "PodDirectory", "scan"]

MAX_ENTRIES = 20_000  # entries read per directory and scan
_LINK = re.compile(r"^([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log$")


@dataclass(frozen=True)
class PodDirectory:
    """What the log directories say about the pods on this node."""

    # pod uid -> (namespace, pod, the pod's log directory)
    pods: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # container id -> (namespace, pod, container name)
    containers: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    # (namespace, pod) -> pod uid, for pods the kubelet names without their UID
    uids: dict[tuple[str, str], str] = field(default_factory=dict)
    truncated: bool = False  # a directory had more than MAX_ENTRIES entries
    _listed: dict[str, tuple[str, ...]] = field(default_factory=dict, repr=False, compare=False)

    def container_names(self, pod_uid: str) -> tuple[str, ...]:
        """The container directories of a pod (listed once, on first use)."""
        found = self._listed.get(pod_uid)
        if found is None:
            pod = self.pods.get(pod_uid)
            entries = _listdir(Path(pod[2]), MAX_ENTRIES) if pod else []
            found = self._listed[pod_uid] = tuple(sorted(e.name for e in entries if e.is_dir()))
        return found

    def names(self, pod_uid: str, container_id: str) -> tuple[str, str, str] | None:
        """(namespace, pod, container) for a pod UID and container ID; None for an unknown pod."""
        pod = self.pods.get(pod_uid)
        if pod is None:
            return None
        namespace, name, _ = pod
        known = self.containers.get(container_id)
        if known is not None and known[:2] == (namespace, name):
            return namespace, name, known[2]
        # Without the link, a pod with a single container still names it unambiguously.
        containers = self.container_names(pod_uid)
        return namespace, name, containers[0] if len(containers) == 1 else ""


def _listdir(path: Path, limit: int) -> list[os.DirEntry[str]]:
    out: list[os.DirEntry[str]] = []
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if len(out) >= limit:
                    out.append(entry)  # one more: says there were more than the limit
                    break
                out.append(entry)
    except OSError:
        return []
    return out


def scan(pods_path: str | Path, containers_path: str | Path | None = None, limit: int = MAX_ENTRIES) -> PodDirectory:
    """Index ``pods_path`` (default layout ``/var/log/pods``) and its sibling ``containers``."""
    pods_path = Path(pods_path)
    containers_path = Path(containers_path) if containers_path else pods_path.parent / "containers"
    pods: dict[str, tuple[str, str, str]] = {}
    entries = _listdir(pods_path, limit)
    links = _listdir(containers_path, limit)
    truncated = len(entries) > limit or len(links) > limit
    for entry in entries[:limit]:
        parts = entry.name.split("_")
        if len(parts) != 3 or not entry.is_dir():  # the entry's type, from the directory read itself
            continue
        namespace, pod, uid = parts
        pods[uid] = (namespace, pod, entry.path)
    by_id: dict[str, tuple[str, str, str]] = {}
    for entry in links[:limit]:
        match = _LINK.match(entry.name)
        if match:
            pod, namespace, container, container_id = match.groups()
            by_id[container_id] = (namespace, pod, container)
    uids = {(namespace, pod): uid for uid, (namespace, pod, _) in pods.items()}
    return PodDirectory(pods, by_id, uids, truncated)
