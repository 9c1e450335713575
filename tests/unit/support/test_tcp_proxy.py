"""The WAN stand-in of the topology tests (tests/support/tcp_proxy.py): it passes bytes unchanged, a cut
resets and refuses, a silent cut swallows, a restore serves again on the same port, and shaping
slows and delays. Only lower bounds of elapsed time are asserted (a loaded machine is only slower)."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.support.mosquitto import wait_until
from tests.support.tcp_proxy import TcpProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _roundtrip(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_bytes_pass_unchanged_both_ways(echo: int) -> None:
    payload = bytes(range(256)) * 4000  # 1 MB, more than one chunk each way
    with TcpProxy(("127.0.0.1", echo)) as wan:
        assert _roundtrip(wan.port, payload) == payload
        assert wan.stats.connections == 1
        # counted by the proxy's threads after they pass a chunk on: wait for the last one
        assert wait_until(lambda: wan.stats.bytes_up == wan.stats.bytes_down == len(payload), 5), wan.stats


def test_cut_resets_and_refuses_and_restore_serves_on_the_same_port(echo: int) -> None:
    with TcpProxy(("127.0.0.1", echo)) as wan:
        port = wan.port
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn.sendall(b"x")
        assert conn.recv(1) == b"x"
        wan.cut()
        assert not wan.is_up and wan.connections == 0
        try:
            assert conn.recv(1) == b""  # the open connection is gone: EOF or reset
        except ConnectionResetError:
            pass
        finally:
            conn.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        wan.restore()
        assert wan.port == port
        assert _roundtrip(port, b"back") == b"back"


def test_silent_cut_swallows_until_restore(echo: int) -> None:
    with TcpProxy(("127.0.0.1", echo)) as wan:
        conn = socket.create_connection(("127.0.0.1", wan.port), timeout=5)
        conn.sendall(b"x")
        assert conn.recv(1) == b"x"  # connected through to the far end before the cut
        wan.cut(silent=True)
        conn.sendall(b"lost")
        conn.settimeout(0.5)
        with pytest.raises(TimeoutError):
            conn.recv(4)  # no answer and no close: only a timeout notices
        late = socket.create_connection(("127.0.0.1", wan.port), timeout=5)  # accepted, then ignored
        late.sendall(b"also lost")
        assert wait_until(lambda: wan.stats.refused == 1, 5)
        wan.restore()
        conn.settimeout(5)
        for held in (conn, late):
            try:
                assert held.recv(1) == b""  # connections of the dark period are dropped at restore
            except ConnectionResetError:
                pass
            held.close()
        assert wan.stats.bytes_dropped >= len(b"lost")
        assert _roundtrip(wan.port, b"again") == b"again"


def test_shaping_limits_rate_and_adds_latency(echo: int) -> None:
    with TcpProxy(("127.0.0.1", echo)) as wan:
        wan.shape(rate=20_000)
        started = time.monotonic()
        assert _roundtrip(wan.port, b"r" * 20_000) == b"r" * 20_000
        # 20 kB at 20 kB/s: the last slice (a tenth of a second's worth) leaves no earlier than 0.9 s
        assert time.monotonic() - started >= 0.9
        wan.shape(latency=0.3)
        started = time.monotonic()
        assert _roundtrip(wan.port, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.6  # 0.3 s each way
        wan.shape()
        assert wan.rate is None and wan.latency == 0.0
        with pytest.raises(ValueError):
            wan.shape(rate=0)
