"""An endpoint that cannot be starved: connection cap, request and idle deadlines, backlog, HTTP details."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.exposition import Exposition, MetricsServer, native_view
from gpu_exporter.web.server import Limits, accepts_gzip
from tests.support import http_get
from tests.support.agent_proc import FAST, Proc
from tests.support.mosquitto import wait_until
from tests.support.samples import fixed_sample


def _status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, value = line.partition(":")
            if key in ("Threads", "VmRSS"):
                out[key] = int(value.split()[0])  # VmRSS in kB
    return out


DROPPED = "gpu_exporter_http_connections_dropped_total"


def test_half_open_flood_leaves_the_scrape_answering_with_threads_and_rss_bounded(tmp_path: Path) -> None:
    cap = 32
    proc = Proc(tmp_path, *FAST, f"--web.max-connections={cap}", "--web.read-timeout=60s").start()
    assert proc.proc is not None
    pid = proc.proc.pid
    proc.scrape()
    before = _status(pid)
    flood: list[socket.socket] = []
    try:
        for _ in range(300):
            conn = socket.create_connection(("127.0.0.1", proc.port), timeout=5)
            conn.sendall(b"GET /metr")  # half a request line, never finished
            flood.append(conn)

        def accepted() -> float:
            for line in proc.scrape().splitlines():
                if line.startswith("gpu_exporter_http_connections_accepted_total "):
                    return float(line.split()[1])
            return 0.0

        def dropped() -> list[str]:
            return [line for line in proc.scrape().splitlines() if line.startswith(f"{DROPPED}{{")]

        def evicted() -> bool:
            return any('reason="evicted"' in line and float(line.split()[-1]) >= 300 - cap for line in dropped())

        # every flood connection reached the server (the scrapes themselves count too)
        assert wait_until(lambda: accepted() >= 300, 20)
        # and was taken from the listen backlog: since the scrapes count as accepted, under load the last
        # flood connections can still wait there when the count reaches 300 (bounded wait)
        assert wait_until(evicted, 20), dropped()
        body = proc.scrape()  # a normal scrape still answers
        assert "gpu_power_watts" in body
        # one thread per served connection at most: the cap, plus the agent's own few (a connection
        # evicted a moment ago may still be ending its thread: wait for that, bounded)
        bound = before["Threads"] + cap + 2
        assert wait_until(lambda: _status(pid)["Threads"] <= bound, 10), (before, _status(pid))
        after = _status(pid)
        # generous: 1 MiB per connection slot
        assert after["VmRSS"] - before["VmRSS"] < cap * 1024, (before, after)
    finally:
        for conn in flood:
            conn.close()
        assert proc.stop() == 0


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    exposition = Exposition(CollectorRegistry(), native_view())
    exposition.update(fixed_sample(mig=0))
    srv = MetricsServer(
        "127.0.0.1:0",
        "/metrics",
        exposition,
        lambda: (True, "ready"),
        limits=Limits(max_connections=8, read_timeout=1.0, idle_timeout=1.0),
    )
    srv.start()
    yield srv
    srv.stop()


def _read_until_closed(conn: socket.socket, limit: float) -> tuple[bytes, bool]:
    """What arrives until the server closes the connection (True) or ``limit`` seconds pass (False)."""
    conn.settimeout(0.2)
    data = b""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = conn.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def test_a_trickled_request_is_closed_at_the_read_deadline(server: MetricsServer) -> None:
    """One byte every 0.1 s: every read succeeds, the request never ends; the deadline still closes it."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        conn.setblocking(False)
        closed = False
        deadline = time.monotonic() + 8  # the read timeout is 1 s
        while not closed and time.monotonic() < deadline:
            try:
                conn.send(b"a")
                closed = conn.recv(1024) == b""
            except BlockingIOError:
                pass
            except OSError:  # reset or broken pipe: closed by the server
                closed = True
            time.sleep(0.1)
        assert closed


def test_an_idle_keepalive_connection_is_closed_after_the_idle_timeout(server: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data, closed = _read_until_closed(conn, 8)
        assert data.startswith(b"HTTP/1.1 200") and closed


def test_a_request_body_is_not_read_as_a_further_request(server: MetricsServer) -> None:
    smuggled = b"GET /nothere HTTP/1.1\r\nHost: x\r\n\r\n"
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as conn:
        conn.sendall(head + smuggled)
        data, _ = _read_until_closed(conn, 3)
    assert data.count(b"HTTP/1.1 ") == 1 and b"404" not in data, data


def test_gzip_with_q0_is_refused_and_vary_is_sent(server: MetricsServer) -> None:
    base = f"http://127.0.0.1:{server.port}/metrics"
    status, body, headers = http_get(base, {"Accept-Encoding": "gzip;q=0, identity"})
    assert status == 200 and "Content-Encoding" not in headers and b"gpu_power_watts" in body
    assert headers["Vary"] == "Accept, Accept-Encoding"  # Accept: OpenMetrics is negotiated too
    _, _, headers = http_get(base, {"Accept-Encoding": "deflate, gzip;q=0.5"})
    assert headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept, Accept-Encoding"


@pytest.mark.parametrize(
    ("header", "gzip"),
    [("gzip", True), ("gzip;q=0", False), ("GZIP; Q=0.0", False), ("*", True), ("*;q=0", False), ("br", False)],
)
def test_accept_encoding(header: str, gzip: bool) -> None:
    assert accepts_gzip(header) is gzip


def test_fifty_quick_connects_all_complete_while_the_server_is_busy() -> None:
    """The listen backlog holds 128 connections the server has not accepted yet (it was 5)."""
    exposition = Exposition(CollectorRegistry(), native_view())
    srv = MetricsServer("127.0.0.1:0", "/metrics", exposition, lambda: (True, ""))  # listening, not accepting
    conns = []
    try:
        completed = 0
        for _ in range(50):
            conn = socket.socket()
            conn.settimeout(0.3)
            conns.append(conn)
            try:
                conn.connect(("127.0.0.1", srv.port))
                completed += 1
            except OSError:
                pass
        assert completed == 50
    finally:
        for conn in conns:
            conn.close()
        srv.stop()


def test_with_every_slot_busy_a_newcomer_gets_a_quick_503_and_is_counted() -> None:
    from gpu_exporter.web.server import Site, WebServer

    release = threading.Event()

    def slow_page(accept_gzip: bool) -> bytes:
        release.wait(20)  # a page still being produced: both slots stay busy answering
        return b"page\n"

    srv = WebServer("127.0.0.1:0", Site("/metrics", slow_page, lambda: (True, "")), limits=Limits(max_connections=2))
    srv.start()
    busy = []
    try:
        for _ in range(2):
            conn = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append(conn)
        assert wait_until(lambda: srv.stats.accepted == 2 and not any(c.waiting for c in srv._conns.values()), 10)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as late:
            late.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            data, closed = _read_until_closed(late, 5)
        assert data.startswith(b"HTTP/1.1 503") and closed
        assert srv.stats.rejected == 1
        release.set()
        for conn in busy:
            data, _ = _read_until_closed(conn, 3)
            assert data.startswith(b"HTTP/1.1 200")
    finally:
        release.set()
        for conn in busy:
            conn.close()
        srv.stop()


def test_a_client_that_stops_reading_the_answer_is_closed_and_its_slot_freed(server: MetricsServer) -> None:
    """Pipelined requests never read: the server's thread blocks writing; the sweep still ends it."""
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.connect(("127.0.0.1", server.port))
        conn.setblocking(False)
        sent = 0
        for _ in range(2000):  # until the server stops taking requests: its thread is stuck writing
            try:
                sent += conn.send(request)
            except BlockingIOError:
                break
        assert wait_until(lambda: server.connections() == 1, 5)
        # read + idle timeout is 2 s here; the sweep runs every 0.5 s
        assert wait_until(lambda: server.connections() == 0, 8), "the stuck connection still holds a slot"
        assert sent > 0
