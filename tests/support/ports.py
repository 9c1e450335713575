"""Free ports on 127.0.0.1: every process a test starts listens on one of these, never on a fixed port."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket of 127.0.0.1:``port``. A port from free_port()
    may be handed to another test's process too (then whichever binds second fails), so "something
    answers on the port" must not pass for "my process is up"."""
    inodes = set()
    with contextlib.suppress(OSError):  # the process may have exited meanwhile: then it listens on nothing
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                inodes.add(os.readlink(fd))
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()  # sl, local address (hex ip:port), remote, state (0A: listen), ..., inode
        if f[1].endswith(f":{port:04X}") and f[3] == "0A" and f"socket:[{f[9]}]" in inodes:
            return True
    return False
