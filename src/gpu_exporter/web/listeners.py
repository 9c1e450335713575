"""The endpoint's listening sockets: bound from ``--web.listen-address`` (once per address, all served by
one server: ``server.py``), or passed by systemd (``activation.py``).

An address is ``HOST:PORT``, ``[IPV6]:PORT`` or ``:PORT`` (every IPv4 address). A lone ``[::]:PORT``
takes IPv4 too, as Linux does by default; with several addresses each IPv6 socket is IPv6 only, so that
``0.0.0.0:9400`` and ``[::]:9400`` can be served together.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Sequence

__all__ = ["BACKLOG", "ListenError", "bind", "bind_all", "describe", "parse_listen"]

BACKLOG = 128


class ListenError(OSError):
    """An address that cannot be listened on: ``strerror`` is the reason, ``str()`` the one line to show
    (``cannot listen on 127.0.0.1:9400: address already in use``)."""

    def __init__(self, address: str, cause: OSError) -> None:
        reason = "address already in use" if cause.errno == errno.EADDRINUSE else (cause.strerror or str(cause))
        super().__init__(cause.errno, reason)
        self.address = address

    def __str__(self) -> str:
        return f"cannot listen on {self.address}: {self.strerror}"


def parse_listen(address: str) -> tuple[str, int, socket.AddressFamily]:
    """``(host, port, family)`` of ``[HOST]:PORT``; no host is every IPv4 address (``0.0.0.0``)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), int(port), family


def bind(address: str, v6only: bool = False) -> socket.socket:
    """A listening TCP socket on ``address``; ListenError when it cannot be had."""
    host, port, family = parse_listen(address)
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ListenError(address, exc) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and v6only:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise ListenError(address, exc) from None
    return sock


def bind_all(addresses: Sequence[str]) -> list[socket.socket]:
    """A listening socket per address, or none: the first that fails closes those already bound."""
    if not addresses:
        raise ValueError("no listen address")
    bound: list[socket.socket] = []
    try:
        for address in addresses:
            bound.append(bind(address, v6only=len(addresses) > 1))
    except ListenError:
        for sock in bound:
            sock.close()
        raise
    return bound


def describe(sock: socket.socket) -> str:
    """``127.0.0.1:9400`` or ``[::1]:9400``: where a listening socket listens."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"
