"""A Jetson's GPU processes and GPU memory, from procfs and the nvmap driver's accounting.

Jetson's sysfs lists no GPU processes, and there is no NVML to ask. A process that uses the GPU holds
the GPU driver's device nodes open: ``/dev/nvhost-ctrl-gpu``, ``/dev/nvhost-as-gpu``, ``/dev/nvhost-gpu``
and friends (JetPack 4 and 5, the ``nvhost-*-gpu`` family), or ``/dev/nvgpu/igpu0/*`` (JetPack 6), so
``<procfs>/<pid>/fd/*`` names them. ``/dev/nvmap`` alone (the camera daemon, a video decoder without
CUDA) is shared memory, not the GPU, and does not count.

GPU memory is what the GPU driver has mapped: ``NvMapMemUsed`` in ``/proc/meminfo`` (JetPack 5 and
later), and per process the nvmap driver's ``iovmm/clients`` table in debugfs (root only, so absent
for a non-root agent; its ``total`` line stands in for ``NvMapMemUsed`` on JetPack 4).

Reading another user's ``/proc/<pid>/fd`` needs ptrace access (root with ``CAP_SYS_PTRACE`` in a pod):
a non-root agent sees only its own processes, and says so once.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NVMAP_CLIENTS", "GpuProcesses", "is_gpu_node", "nvmap_clients", "scan"]

log = logging.getLogger(__name__)

NVMAP_CLIENTS = ("kernel", "debug", "nvmap", "iovmm", "clients")  # under sysfs
_NVGPU_DIR = "/dev/nvgpu/"
_MAX_FDS = 4096  # per process: a process with more open files is read only this far


def is_gpu_node(target: str) -> bool:
    """Whether a ``/proc/<pid>/fd`` link target is one of the Jetson GPU driver's device nodes."""
    if target.startswith(_NVGPU_DIR):
        return True
    if not target.startswith("/dev/nvhost-"):
        return False
    return target == "/dev/nvhost-gpu" or target.endswith("-gpu")


@dataclass(frozen=True)
class GpuProcesses:
    pids: tuple[int, ...]  # processes holding a GPU device node, ascending
    unreadable: int  # processes whose fd folder could not be read (another user's, without ptrace)


def scan(procfs: Path) -> GpuProcesses:
    """Every process under ``procfs`` that holds a GPU device node open."""
    found: list[int] = []
    unreadable = 0
    try:
        entries = [e.name for e in os.scandir(procfs) if e.name.isdigit()]
    except OSError:
        return GpuProcesses((), 0)
    for name in entries:
        fd_dir = os.path.join(procfs, name, "fd")
        try:
            with os.scandir(fd_dir) as fds:
                for count, fd in enumerate(fds):
                    if count >= _MAX_FDS:
                        break
                    try:
                        target = os.readlink(fd.path)
                    except OSError:
                        continue  # closed meanwhile
                    if is_gpu_node(target):
                        found.append(int(name))
                        break
        except PermissionError:
            unreadable += 1
        except OSError:
            continue  # exited meanwhile
    return GpuProcesses(tuple(sorted(found)), unreadable)


def nvmap_clients(sysfs: Path) -> tuple[dict[int, int], int | None] | None:
    """nvmap's per-process GPU-mapped memory in bytes and its total, or None where unreadable.

    The table reads (sizes in KiB)::

        CLIENT                        PROCESS      PID        SIZE
        user                          deepstream   4242     262144K
        total                                               300000K
    """
    try:
        text = Path(sysfs, *NVMAP_CLIENTS).read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    by_pid: dict[int, int] = {}
    total: int | None = None
    for line in text.splitlines():
        parts = line.split()
        if not parts or not parts[-1].endswith("K") or not parts[-1][:-1].isdigit():
            continue
        size = int(parts[-1][:-1]) * 1024
        if parts[0] == "total":
            total = size
        elif len(parts) >= 4 and parts[-2].isdigit():
            pid = int(parts[-2])
            by_pid[pid] = by_pid.get(pid, 0) + size
    return by_pid, total
