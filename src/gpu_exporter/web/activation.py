"""systemd socket activation (``--web.systemd-socket``): serve on the listening sockets systemd passes.

systemd (a ``.socket`` unit, or ``systemd-socket-activate``) opens the sockets, starts the service with
them as file descriptors 3, 4, ... and says so in the environment: ``LISTEN_FDS`` (how many) and
``LISTEN_PID`` (the process they are meant for, so that a child that inherits the environment does not
take them too). The sockets are taken here as ``sd_listen_fds(3)`` describes: only when ``LISTEN_PID`` is
this process, each marked close-on-exec, and the variables removed from the environment afterwards. Only
TCP stream sockets already listening are served; anything else is a start-up error of one line.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

__all__ = ["LISTEN_FDS_START", "ActivationError", "inherited_sockets"]

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
_MAX_FDS = 64  # far more sockets than a .socket unit names; a larger count is a broken environment
_VARIABLES = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")


class ActivationError(ValueError):
    """No usable socket was passed; the message is one line."""


def inherited_sockets(environ: MutableMapping[str, str] | None = None, pid: int | None = None) -> list[socket.socket]:
    """The listening sockets passed to this process (``pid``, by default ours), in order (fd 3 first)."""
    environ = os.environ if environ is None else environ
    pid = os.getpid() if pid is None else pid
    count_text, pid_text = environ.get("LISTEN_FDS"), environ.get("LISTEN_PID")
    if count_text is None:
        raise ActivationError(
            "--web.systemd-socket: no socket was passed (LISTEN_FDS is not set): start the agent from its "
            ".socket unit, or drop the flag to listen on --web.listen-address"
        )
    if pid_text is None or not pid_text.strip().isdigit():
        raise ActivationError(f"--web.systemd-socket: LISTEN_PID is {pid_text!r}, not a process id")
    if int(pid_text) != pid:
        raise ActivationError(
            f"--web.systemd-socket: the sockets were passed to process {int(pid_text)}, not to this one ({pid})"
        )
    if not count_text.strip().isdigit() or not 1 <= int(count_text) <= _MAX_FDS:
        raise ActivationError(f"--web.systemd-socket: LISTEN_FDS={count_text!r} names no socket")
    sockets: list[socket.socket] = []
    try:
        for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + int(count_text)):
            sockets.append(_listening(fd))
    except ActivationError:
        for sock in sockets:
            sock.detach()  # not ours to close: systemd keeps them for the next start
        raise
    for name in _VARIABLES:
        environ.pop(name, None)
    return sockets


def _listening(fd: int) -> socket.socket:
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise ActivationError(f"--web.systemd-socket: file descriptor {fd} is not a socket ({exc.strerror})") from None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.detach()
        raise ActivationError(
            f"--web.systemd-socket: file descriptor {fd} is not a TCP stream socket (use ListenStream=[HOST:]PORT)"
        )
    if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise ActivationError(f"--web.systemd-socket: file descriptor {fd} is not listening")
    os.set_inheritable(fd, False)
    return sock
