"""The endpoint's rules that a client notices, each on the real server over a real socket: which
connection makes room at the cap, how Accept-Encoding is negotiated, which basic-auth credentials pass."""

from __future__ import annotations

import base64
import gzip
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import bcrypt
import pytest

from gpu_exporter.web import auth as auth_module
from gpu_exporter.web.server import Limits, Site, WebServer, accepts_gzip
from gpu_exporter.web.webconfig import load_web_config
from tests.support import http_get, wait_for

PAGE = b"gpu_up 1\n" * 200
Start = Callable[..., WebServer]


def _page(gz: bool) -> bytes:
    return gzip.compress(PAGE) if gz else PAGE


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    servers: list[WebServer] = []

    def make(
        limits: Limits | None = None, users: dict[str, str] | None = None, page: Callable[[bool], bytes] = _page
    ) -> WebServer:
        web = None
        if users:
            lines = "".join(
                f"  {user}: '{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(4)).decode()}'\n" for user, pw in users.items()
            )
            path = tmp_path / "web.yml"
            path.write_text("basic_auth_users:\n" + lines)
            web = load_web_config(str(path))
        srv = WebServer("127.0.0.1:0", Site("/metrics", page, lambda: (True, "ready")), web, limits)
        srv.start()
        servers.append(srv)
        return srv

    yield make
    for srv in servers:
        srv.stop()


def _closed_by_server(conn: socket.socket, within: float) -> bool:
    """Whether the server closes ``conn`` (EOF or reset) within ``within`` seconds."""
    conn.settimeout(0.1)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if conn.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def _answer(conn: socket.socket) -> bytes:
    conn.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_at_the_cap_the_connection_waiting_longest_makes_room_not_the_newest(start: Start) -> None:
    """Half-open connections hold slots; a scraper arriving at the cap closes the oldest of them, so a
    client that just connected (and is about to send its request) is still served."""
    srv = start(Limits(max_connections=3, read_timeout=30.0, idle_timeout=30.0))
    conns = []
    try:
        for i in range(3):
            conn = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            conn.sendall(b"GET /metr")  # half a request line
            conns.append(conn)
            assert wait_for(lambda n=i + 1: srv.connections() == n and srv.stats.accepted == n, 10)
        status, body, _ = http_get(f"http://127.0.0.1:{srv.port}/metrics")  # the fourth: at the cap
        assert status == 200 and body == PAGE
        assert srv.stats.evicted == 1
        assert _closed_by_server(conns[0], 5), "the oldest waiting connection was not the one closed"
        for conn in conns[1:]:  # the newer ones finish their requests and are answered
            conn.sendall(b"ics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _answer(conn).startswith(b"HTTP/1.1 200"), "a newer connection was closed instead"
    finally:
        for conn in conns:
            conn.close()


def test_at_the_cap_a_password_check_queued_first_keeps_its_connection(
    start: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot holds a request whose password is being checked or waits for the check pool: a newcomer
    closes the connection whose check ranks lowest (the pair that came last), so a scraper queued behind
    one slow check is still answered. The check waits on a gate, so that the order is the test's."""
    gate = threading.Event()
    real = auth_module._checkpw

    def gated(password: bytes, hashed: bytes) -> bool:
        gate.wait(10)
        return real(password, hashed)

    monkeypatch.setattr(auth_module, "_checkpw", gated)
    srv = start(Limits(max_connections=3, read_timeout=30.0, idle_timeout=30.0), users={"prometheus": "right"})
    pool = srv.auth_state.pool
    conns = []
    try:
        for i, pair in enumerate([b"intruder:x1", b"prometheus:right", b"intruder:x2"]):
            conn = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            header = b"Authorization: Basic " + base64.b64encode(pair) + b"\r\n"
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + header + b"\r\n")
            conns.append(conn)
            assert wait_for(lambda n=i + 1: pool.checks + pool.queued() == n, 10)  # one runs, the rest wait
        conns.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))  # at the cap
        assert wait_for(lambda: srv.stats.evicted == 1, 10)
        assert _closed_by_server(conns[2], 5), "the last pair's connection was not the one closed"
        gate.set()
        assert _answer(conns[1]).startswith(b"HTTP/1.1 200"), "the scraper's connection was closed instead"
        assert _answer(conns[0]).startswith(b"HTTP/1.1 401")
    finally:
        gate.set()
        for conn in conns:
            conn.close()


def test_clients_that_stop_reading_their_answer_lose_their_slots(start: Start) -> None:
    """Two clients ask for a page far larger than the socket buffers and never read it: both slots are
    busy answering (a newcomer gets 503), until the sweep closes them past the answer's deadline."""
    big = b"#" * (32 << 20)
    srv = start(Limits(max_connections=2, read_timeout=0.5, idle_timeout=1.0), page=lambda gz: big)
    stuck = []
    try:
        for _ in range(2):
            conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            conn.connect(("127.0.0.1", srv.port))
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # ... and never read
            stuck.append(conn)
            conn.settimeout(20)
            assert conn.recv(16, socket.MSG_PEEK).startswith(b"HTTP/1.1 200")  # its answer has begun
        assert srv.connections() == 2
        assert http_get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 503  # both slots busy answering
        # past read + idle timeout (1.5 s) the sweep closes them: the endpoint answers again
        assert wait_for(lambda: http_get(f"http://127.0.0.1:{srv.port}/healthz")[0] == 200, 15)
        # one freed slot answers /healthz; on a loaded machine the sweep may close the second a turn later
        assert wait_for(lambda: srv.stats.timeouts >= 2, 15), srv.stats.timeouts
    finally:
        for conn in stuck:
            conn.close()


@pytest.mark.parametrize(
    ("header", "gzip_ok"),
    [
        ("gzip;q=0, *", False),  # gzip refused by name: a wildcard does not bring it back
        ("*, gzip;q=0", False),
        ("x-gzip;q=0, *;q=1", False),
        ("*;q=0, gzip", True),  # named beats the wildcard, both ways
        ("identity, *;q=0.5", True),
        ("gzip;q=0.001", True),
        ("deflate, br", False),
        ("", False),
    ],
)
def test_accept_encoding_a_named_gzip_beats_the_wildcard(header: str, gzip_ok: bool) -> None:
    assert accepts_gzip(header) is gzip_ok


def test_gzip_refused_by_name_is_not_sent_whatever_the_wildcard_says(start: Start) -> None:
    srv = start()
    status, body, headers = http_get(f"http://127.0.0.1:{srv.port}/metrics", {"Accept-Encoding": "gzip;q=0, *"})
    assert status == 200 and "Content-Encoding" not in headers and body == PAGE


def _basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("scheme", ["Basic", "basic", "BASIC"])
def test_the_auth_scheme_is_case_insensitive(start: Start, scheme: str) -> None:
    """RFC 9110 11.1: the scheme name is case-insensitive; some clients send it in lower case."""
    srv = start(users={"prometheus": "s3cret"})
    token = base64.b64encode(b"prometheus:s3cret").decode()
    assert http_get(f"http://127.0.0.1:{srv.port}/metrics", {"Authorization": f"{scheme} {token}"})[0] == 200


@pytest.mark.parametrize("password", ["pa:ss", ":leading", "trailing:", "a:b:c:d"])
def test_a_password_with_colons_is_accepted_and_only_the_first_colon_ends_the_user(
    start: Start,
    password: str,
) -> None:
    """RFC 7617: the user name cannot hold a colon, the password can; the first colon separates them."""
    srv = start(users={"prometheus": password})
    url = f"http://127.0.0.1:{srv.port}/metrics"
    assert http_get(url, _basic("prometheus", password))[0] == 200
    assert http_get(url, _basic("prometheus", password + "x"))[0] == 401
    assert http_get(url, _basic("prometheus", password.replace(":", "")))[0] == 401
