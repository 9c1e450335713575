"""From a process's ``/proc/<pid>/cgroup`` to the pod UID and container ID that own it.

The kubelet places containers under a ``kubepods`` hierarchy whose spelling depends on the cgroup
driver and the runtime; all of these occur:

- cgroupfs driver (v1 and v2): ``/kubepods/burstable/pod<uid>/<container id>``
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/``
  followed by ``cri-containerd-<id>.scope`` (containerd), ``crio-<id>.scope`` (CRI-O) or
  ``docker-<id>.scope`` (Docker)
- inside a cgroup namespace the path is relative to the reader's own cgroup, e.g. ``/../../kubepods-...``

cgroup v1 lists one line per controller hierarchy, v2 a single ``0::`` line; any line naming a pod
will do, and the first one that also names a container wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import hostread

__all__ = ["ContainerCgroup", "parse_cgroup", "read_pid"]

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"pod({_UID})(?:\.slice)?(?:/|$)")
# The last path element: a bare 64-hex ID, or a systemd scope named after the runtime.
_CONTAINER = re.compile(r"/(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?/?$")


@dataclass(frozen=True, slots=True)
class ContainerCgroup:
    pod_uid: str  # with dashes, as the API server spells it
    container_id: str  # 64 hex digits, without the runtime prefix; "" when the line names none


def parse_cgroup(text: str) -> ContainerCgroup | None:
    """The pod and container a ``/proc/<pid>/cgroup`` file names, or None for a non-pod process."""
    best: ContainerCgroup | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        path = parts[2].strip()
        pod = _POD.search(path)
        if not pod:
            continue
        uid = pod.group(1).replace("_", "-")
        # CRI-O's conmon monitor lives in the pod's cgroup too, but is not a container.
        container = _CONTAINER.search(path) if "crio-conmon-" not in path else None
        found = ContainerCgroup(uid, container.group(1) if container else "")
        if found.container_id:
            return found
        best = best or found
    return best


def read_pid(procfs: str | Path, pid: int) -> ContainerCgroup | None:
    """Read and parse ``<procfs>/<pid>/cgroup``; None when the process is gone or not in a pod."""
    try:
        text = hostread.read_text(Path(procfs) / str(pid) / "cgroup")  # bounded: never /dev/zero whole
    except OSError:
        return None
    return parse_cgroup(text)
