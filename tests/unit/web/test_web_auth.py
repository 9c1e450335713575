"""Basic auth and the web config's exporter-toolkit keys: the check pool's order, unknown users, long
passwords, rate_limit, and every key the toolkit accepts (an unknown one refused in one line)."""

from __future__ import annotations

import base64
import logging
import secrets
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from gpu_exporter.web.auth import AuthState, BasicAuth, Verdict
from gpu_exporter.web.authpool import CheckPool
from gpu_exporter.web.ratelimit import RateLimiter, parse_go_duration
from gpu_exporter.web.server import ServerCollector
from gpu_exporter.web.webconfig import load_web_config
from tests.support.mosquitto import wait_until
from tests.support.procs import one_line_exit_2, run_cli
from tests.support.tls import client_cert
from tests.support.web import bcrypt_hash


def _header(user: str | bytes, password: str | bytes) -> str:
    raw = (user if isinstance(user, bytes) else user.encode()) + b":"
    raw += password if isinstance(password, bytes) else password.encode()
    return "Basic " + base64.b64encode(raw).decode()


_hash = bcrypt_hash


# --- the check pool ---


def test_a_full_queue_refuses_a_fresh_pair_and_takes_a_retried_one_ahead_of_the_others() -> None:
    release = threading.Event()
    ran: list[str] = []

    def check(name: str) -> Any:
        def run() -> bool:
            release.wait(10)
            ran.append(name)
            return False

        return run

    pool = CheckPool(workers=1, depth=2)
    state = AuthState(pool)
    try:
        first = pool.submit(state.ticket(b"busy", False), check("busy"))  # taken by the worker at once
        assert first is not None and wait_until(lambda: first.started, 5)
        fresh = [pool.submit(state.ticket(k, False), check(k.decode())) for k in (b"a", b"b")]
        assert all(job is not None for job in fresh) and pool.queued() == 2
        # the queue is full of pairs seen once: another fresh one is refused, the same one later is not
        assert pool.submit(state.ticket(b"scraper", False), check("scraper")) is None
        retried = pool.submit(state.ticket(b"scraper", False), check("scraper"))
        assert retried is not None
        assert fresh[1] is not None and fresh[1].wait(0) == "busy"  # pushed out to make room
        release.set()
        assert retried.wait(10) is False and fresh[0] is not None and fresh[0].wait(10) is False
        assert ran == ["busy", "scraper", "a"]  # the retry went ahead of the pair queued before it
        assert pool.refused == 2
    finally:
        release.set()
        pool.stop()


def test_a_fresh_pair_from_a_refused_connection_ranks_after_one_from_a_new_connection() -> None:
    state = AuthState(CheckPool())
    try:
        suspect = state.ticket(b"flood", True)
        newcomer = state.ticket(b"scraper", False)
        assert newcomer < suspect  # although the flood's pair came first
        assert state.ticket(b"flood", True) < newcomer  # sent again, a pair keeps its first time
    finally:
        state.pool.stop()


# --- users and passwords ---


def test_an_unknown_user_costs_a_check_against_the_costliest_configured_hash(monkeypatch: pytest.MonkeyPatch) -> None:
    cheap, dear = _hash(b"x", 4), _hash(b"y", 5)
    seen: list[bytes] = []
    real = bcrypt.checkpw

    def recording(password: bytes, hashed: bytes) -> bool:
        seen.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", recording)
    auth = BasicAuth({"alice": cheap, "bob": dear})
    try:
        assert auth.check(_header("mallory", "y")) is Verdict.DENIED  # bob's password, another name
        assert auth.check(_header("bob", "wrong")) is Verdict.DENIED
        assert seen == [dear.encode(), dear.encode()]  # the same work for both: the name is not told
        assert auth.check(_header("bob", "y")) is Verdict.OK
    finally:
        auth.state.pool.stop()


def test_a_password_past_72_bytes_counts_with_its_first_72_as_the_exporter_toolkit_does() -> None:
    password = secrets.token_hex(50).encode()  # 100 bytes
    auth = BasicAuth({"prometheus": _hash(password[:72])})  # what Go's bcrypt hashed for it
    try:
        assert auth.check(_header("prometheus", password)) is Verdict.OK
        assert auth.check(_header("prometheus", password[:72] + b"anything")) is Verdict.OK
        assert auth.check(_header("prometheus", b"X" + password[1:])) is Verdict.DENIED
        assert auth.check(_header("prometheus", password[:71])) is Verdict.DENIED
    finally:
        auth.state.pool.stop()


def test_a_password_that_is_not_utf8_is_checked_as_bytes() -> None:
    password = b"\xff\xfe-binary"
    auth = BasicAuth({"prometheus": _hash(password)})
    try:
        assert auth.check(_header("prometheus", password)) is Verdict.OK
        assert auth.check(_header("prometheus", b"\xff")) is Verdict.DENIED
        assert auth.check("Basic !!!") is Verdict.DENIED and auth.check("Bearer x") is Verdict.DENIED
    finally:
        auth.state.pool.stop()


# --- the server: rate_limit and the toolkit's keys ---


def _get(url: str, ctx: ssl.SSLContext | None = None, auth: tuple[str, str] | None = None) -> int:
    headers = {"Authorization": _header(*auth)} if auth else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10, context=ctx) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_rate_limit_answers_429_past_the_burst_and_spares_the_probes(serve: Any, tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("rate_limit:\n  interval: 1m\n  burst: 2\n")
    srv = serve(str(web))
    base = f"http://127.0.0.1:{srv.port}"
    assert [_get(base + "/metrics") for _ in range(3)] == [200, 200, 429]
    assert _get(base + "/") == 429
    assert _get(base + "/healthz") == 200 and _get(base + "/readyz") == 200
    refused = {
        sample.labels["reason"]: sample.value
        for family in ServerCollector(lambda: srv).collect()
        if family.name == "gpu_exporter_http_requests_refused"
        for sample in family.samples
    }
    assert refused == {"rate_limit": 2, "password_checks": 0}


def test_rate_limit_lets_exactly_its_burst_through_and_an_idle_hour_refills_no_more() -> None:
    """Go's rate.Limiter: ``burst`` requests at once, then one per interval; tokens never pile up past
    ``burst``, however long nobody asked."""
    now = [0.0]
    limiter = RateLimiter(interval=10.0, burst=3, clock=lambda: now[0])
    assert [limiter.allow() for _ in range(4)] == [True, True, True, False]
    now[0] += 10.0  # one interval: one token
    assert [limiter.allow() for _ in range(2)] == [True, False]
    now[0] += 3600.0  # a quiet hour: the bucket is full again, not 360 deep
    assert [limiter.allow() for _ in range(4)] == [True, True, True, False]
    assert limiter.refused == 3


def test_every_key_of_the_exporter_toolkit_is_taken(serve: Any, tmp_path: Path, tls: dict[str, str]) -> None:
    sans = client_cert(tls, tmp_path / "san", "DNS:scraper.example")
    indent = "\n" + " " * 4
    cert = indent.join(Path(tls["cert"]).read_text().strip().splitlines())
    key = indent.join(Path(tls["key"]).read_text().strip().splitlines())
    web = tmp_path / "web.yml"
    web.write_text(
        "tls_server_config:\n"
        f"  cert: |{indent}{cert}\n"
        f"  key: |{indent}{key}\n"
        f"  client_ca_file: {tls['ca']}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        "  client_allowed_sans: [scraper.example]\n"
        "  min_version: TLS12\n  max_version: TLS13\n"
        "  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384]\n"
        "  prefer_server_cipher_suites: true\n"
        "  curve_preferences: [X25519, CurveP256]\n"
        "http_server_config:\n  http2: true\n  headers:\n    X-Frame-Options: deny\n"
        "rate_limit:\n  interval: 10ms\n  burst: 100\n"
        f"basic_auth_users:\n  prometheus: '{_hash(b'pw')}'\n"
    )
    srv = serve(str(web))
    url = f"https://127.0.0.1:{srv.port}/metrics"

    def ctx(cert: tuple[str, str] | None, tls12: bool = False) -> ssl.SSLContext:
        c = ssl.create_default_context(cafile=tls["ca"])
        if tls12:
            c.maximum_version = ssl.TLSVersion.TLSv1_2
        if cert:
            c.load_cert_chain(*cert)
        return c

    assert _get(url, ctx(sans), ("prometheus", "pw")) == 200
    assert _get(url, ctx(sans, tls12=True), ("prometheus", "pw")) == 200  # one of the listed TLS 1.2 suites
    assert _get(url, ctx(sans), ("prometheus", "no")) == 401
    # a verified certificate without one of the allowed names: the connection is closed
    with pytest.raises((OSError, urllib.error.URLError)):
        _get(url, ctx((tls["client_cert"], tls["client_key"])), ("prometheus", "pw"))
    assert _get(f"https://127.0.0.1:{srv.port}/healthz", ctx(None)) == 200  # probes need no certificate


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rate_limit:\n  interval: 1s\n  burst: 1\n  per_client: true\n", "rate_limit: unknown key 'per_client'"),
        ("rate_limit:\n  interval: soon\n", "rate_limit.interval"),
        ("rate_limit:\n  interval: 1s\n  burst: -1\n", "rate_limit.burst"),
        ("http_server_config:\n  keepalive: true\n", "http_server_config: unknown key 'keepalive'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  ocsp: true\n", "unknown key 'ocsp'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [RC4]\n", "unknown name 'RC4'"),
        ("tls_server_config:\n  cert_file: a\n  key_file: b\n  curve_preferences: [P7]\n", "unknown name 'P7'"),
        ("tls_server_config:\n  cert_file: a\n  cert: b\n  key_file: c\n", "give cert or cert_file, not both"),
        ("auth_excluded_paths: [/metrics]\n", "unknown key 'auth_excluded_paths'"),
    ],
)
def test_a_key_the_toolkit_does_not_know_is_one_line_and_exit_2(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "web.yml"
    path.write_text(text)
    assert expected in one_line_exit_2(run_cli("--gpu-vendor=fake", f"--web.config.file={path}"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1m30s", 90.0), ("500ms", 0.5), ("0", 0.0), (0, 0.0), (1_000_000_000, 1.0), ("1.5h", 5400.0), ("-1s", -1.0)],
)
def test_rate_limit_intervals_are_go_durations(text: Any, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)


def test_a_check_that_outlasts_its_request_is_remembered_for_the_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A costly hash on a slow CPU: the request gives up waiting (429), the check runs on and its result
    is kept, so the scraper's next request is a lookup instead of a check that never finishes in time."""
    release = threading.Event()
    real = bcrypt.checkpw

    def slow(password: bytes, hashed: bytes) -> bool:
        release.wait(10)
        return bool(real(password, hashed))

    monkeypatch.setattr(bcrypt, "checkpw", slow)
    auth = BasicAuth({"prometheus": _hash(b"pw")})
    try:
        assert auth.check(_header("prometheus", "pw"), timeout=0.2) is Verdict.BUSY
        release.set()
        assert wait_until(lambda: auth.state.pool.checks == 1 and auth.state.pool.queued() == 0, 5)
        assert wait_until(lambda: auth.state.recall(_key(auth, "prometheus", b"pw")) is True, 5)
        assert auth.check(_header("prometheus", "pw"), timeout=0.2) is Verdict.OK
        assert auth.state.pool.checks == 1  # the retry cost no bcrypt
    finally:
        release.set()
        auth.state.pool.stop()


def _key(auth: BasicAuth, user: str, password: bytes) -> bytes:
    hashed = auth._users[user.encode()]
    return auth.state.key(True, user.encode(), hashed, password)


def test_a_curve_this_python_cannot_set_gives_way_to_the_next_listed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path, tls: dict[str, str]
) -> None:
    """Python 3.10's ssl cannot set X25519: the next listed group is offered, and a list of none fails in one line."""
    real = ssl.SSLContext.set_ecdh_curve

    def like_310(self: ssl.SSLContext, name: str) -> None:
        if name == "X25519":
            raise ssl.SSLError(1, "[EC: UNKNOWN_GROUP] unknown group")
        real(self, name)

    monkeypatch.setattr(ssl.SSLContext, "set_ecdh_curve", like_310)
    web = tmp_path / "web.yml"
    base = f"tls_server_config:\n  cert_file: {tls['cert']}\n  key_file: {tls['key']}\n"
    web.write_text(base + "  curve_preferences: [X25519, CurveP256]\n")
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.web.tls"):
        assert load_web_config(str(web)).tls is not None
    assert "CurveP256 offered instead of X25519" in caplog.text
    web.write_text(base + "  curve_preferences: [X25519]\n")
    with pytest.raises(ValueError, match="curve_preferences: none of them is available here: X25519"):
        load_web_config(str(web))
