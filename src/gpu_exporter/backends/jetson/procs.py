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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import hostread

__all__ = ["NVMAP_CLIENTS", "GpuProcesses", "ProcessScanner", "is_gpu_node", "nvmap_clients", "scan"]

log = logging.getLogger("gpu_exporter.backends.jetson_procs")  # the name its log lines have always had

NVMAP_CLIENTS = ("kernel", "debug", "nvmap", "iovmm", "clients")  # under sysfs
_NVGPU_DIR = "/dev/nvgpu/"
_MAX_FDS = 4096  # per process: a process with more open files is read only this far
_NVMAP_CAP = 1 << 20  # bytes of nvmap's table: some 15,000 clients; a longer one is refused (hostread)


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


def _holds_gpu(procfs: Path | str, pid: str) -> bool | None:
    """Whether the process holds a GPU device node open; None when its fd folder cannot be read."""
    try:
        with os.scandir(os.path.join(procfs, pid, "fd")) as fds:
            for count, fd in enumerate(fds):
                if count >= _MAX_FDS:
                    break
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue  # closed meanwhile
                if is_gpu_node(target):
                    return True
    except PermissionError:
        return None
    except OSError:
        return False  # exited meanwhile
    return False


def scan(procfs: Path) -> GpuProcesses:
    """Every process under ``procfs`` that holds a GPU device node open."""
    return ProcessScanner(procfs, rescan=0.0).scan()


class ProcessScanner:
    """``scan()`` each cycle, reading only what may have changed.

    A new PID and every GPU process are read each time (a process that exits, or whose PID is reused,
    leaves at once); a process seen without the GPU is read again only after ``rescan`` seconds, so a
    long-running process that opens the GPU late is seen within that time. On a node with thousands of
    open files this turns one ``readlink`` per file per cycle into about one per file per ``rescan``.
    """

    def __init__(self, procfs: Path, rescan: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._procfs = procfs
        self._rescan = rescan
        self._clock = clock
        self._quiet: dict[str, float] = {}  # pid -> when it was last seen without the GPU

    def scan(self) -> GpuProcesses:
        try:
            pids = [e.name for e in os.scandir(self._procfs) if e.name.isdigit()]
        except OSError:
            return GpuProcesses((), 0)
        now = self._clock()
        found: list[int] = []
        unreadable = 0
        quiet: dict[str, float] = {}
        for pid in pids:
            checked = self._quiet.get(pid)
            if checked is not None and now - checked < self._rescan:
                quiet[pid] = checked
                continue
            holds = _holds_gpu(self._procfs, pid)
            if holds:
                found.append(int(pid))
            elif holds is None:
                unreadable += 1
                quiet[pid] = now  # not readable now, not readable in a moment either
            else:
                quiet[pid] = now
        self._quiet = quiet  # exited PIDs drop out
        return GpuProcesses(tuple(sorted(found)), unreadable)


def nvmap_clients(sysfs: Path) -> tuple[dict[int, int], int | None] | None:
    """nvmap's per-process GPU-mapped memory in bytes and its total, or None where unreadable.

    The table reads (sizes in KiB)::

        CLIENT                        PROCESS      PID        SIZE
        user                          deepstream   4242     262144K
        total                                               300000K
    """
    try:
        text = hostread.read_text(Path(sysfs, *NVMAP_CLIENTS), cap=_NVMAP_CAP, encoding="ascii")
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
