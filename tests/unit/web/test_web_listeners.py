"""One endpoint on several listening sockets: each answers, and they share one connection cap and one
set of counters, so that a flood on one address is bounded as on one address."""

from __future__ import annotations

import socket

import pytest

from gpu_exporter.web.listeners import ListenError, bind_all
from gpu_exporter.web.server import Limits, Site, WebServer
from tests.support import http_get, wait_until


def _site() -> Site:
    return Site("/metrics", lambda gz: b"gpu_up 1\n", lambda: (True, "ready"))


def test_every_listener_answers_and_one_cap_covers_them_all() -> None:
    srv = WebServer(["127.0.0.1:0", "127.0.0.2:0"], _site(), limits=Limits(max_connections=2, read_timeout=30))
    srv.start()
    idle: list[socket.socket] = []
    try:
        (first, port1), (second, port2) = (a.rsplit(":", 1) for a in srv.addresses)
        assert (first, second) == ("127.0.0.1", "127.0.0.2")
        for host, port in ((first, port1), (second, port2)):
            assert http_get(f"http://{host}:{port}/metrics")[1] == b"gpu_up 1\n"
        for _ in range(2):  # both slots held by connections on the first address that send nothing
            idle.append(socket.create_connection((first, int(port1)), timeout=5))
        wait_until(lambda: srv.connections() == 2, timeout=5, what="two idle connections held")
        # a scrape on the second address gets a slot by evicting one of the first's idle connections
        assert http_get(f"http://{second}:{port2}/healthz")[0] == 200
        assert srv.stats.evicted >= 1 and srv.connections() <= 2
    finally:
        for conn in idle:
            conn.close()
        srv.stop()
    with pytest.raises(OSError):  # stop closes every listener
        socket.create_connection((first, int(port1)), timeout=2).close()


def test_the_first_address_that_fails_releases_those_bound_before_it() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()
        with pytest.raises(ListenError) as err:
            bind_all([f"127.0.0.1:{port}", f"127.0.0.2:{taken}"])
    assert str(err.value) == f"cannot listen on 127.0.0.2:{taken}: address already in use"
    again = bind_all([f"127.0.0.1:{port}"])  # the first one was closed, not left listening
    again[0].close()
