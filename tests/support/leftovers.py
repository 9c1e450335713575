"""Processes that outlive the test that started them, found through /proc and stopped by PID.

The test session makes itself a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): a process that
its parent left behind (a daemon that forked away, a grandchild of a wrapper that was killed) is then
re-parented to the session instead of to init, so it stays among the session's descendants and cannot
escape the check. tests/conftest.py names every descendant still running when the session ends,
fails the session, and stops them (SIGTERM, then SIGKILL), so that nothing leaks either way.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Proc", "become_subreaper", "descendants", "reap_zombies", "stop_descendants"]

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Proc:
    pid: int
    state: str  # the letter of /proc/PID/stat: R, S, D, Z (zombie: exited, not yet waited for), ...
    cmdline: str

    def __str__(self) -> str:
        return f"PID {self.pid} ({self.state}): {self.cmdline[:300]}"


def become_subreaper() -> bool:
    """Orphaned descendants come back to this process instead of to init; False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def _children(pid: int) -> list[int]:
    """Direct children of ``pid``: /proc/PID/task/*/children (one file per thread that forked)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                out.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _children_by_scan() -> dict[int, list[int]]:
    """Every process's children, from each /proc/PID/stat (kernels without the children files)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # the command name in () may hold spaces
        if len(fields) > 1 and fields[1].isdigit():
            tree.setdefault(int(fields[1]), []).append(int(name))
    return tree


def _describe(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None  # gone meanwhile
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmdline = ""
    return Proc(pid, state, cmdline or "?")


def descendants(root: int | None = None) -> list[Proc]:
    """Every process below ``root`` (default: this one), parents before their children."""
    root = os.getpid() if root is None else root
    use_files = os.path.exists(f"/proc/{root}/task/{root}/children")
    tree = None if use_files else _children_by_scan()
    out: list[Proc] = []
    todo = [root]
    seen = {root}
    while todo:
        pid = todo.pop(0)
        kids = _children(pid) if tree is None else tree.get(pid, [])
        for kid in kids:
            if kid in seen:
                continue
            seen.add(kid)
            found = _describe(kid)
            if found is not None:
                out.append(found)
                todo.append(kid)
    return out


def reap_zombies(procs: Iterable[Proc]) -> None:
    """Wait for this process's exited children (zombies re-parented here, or never waited for)."""
    for proc in procs:
        if proc.state == "Z":
            try:
                os.waitpid(proc.pid, os.WNOHANG)
            except ChildProcessError:
                pass  # another process's child: its parent reaps it


def stop_descendants(grace: float = 5.0) -> None:
    """SIGTERM every descendant (by PID), SIGKILL what is still running after ``grace`` seconds, reap."""

    def running() -> list[Proc]:
        found = descendants()
        reap_zombies(found)
        return [p for p in found if p.state != "Z"]

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in running():
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
