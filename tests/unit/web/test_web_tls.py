"""--web.config.file: real TLS (certificates made by openssl here), basic auth, mTLS, rotation, bad files,
and the real Prometheus scraping the agent over HTTPS with basic auth."""

from __future__ import annotations

import base64
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import bcrypt
import pytest

from gpu_exporter.web.tls import TlsFiles, TlsState
from tests.support import free_port, lone_bridge_args, spawn_logged, stop_process
from tests.support.agent_proc import FAST
from tests.support.mosquitto import make_tls, wait_until
from tests.support.procs import one_line_exit_2, run_cli
from tests.support.tsdb import PrometheusServer
from tests.support.web import bcrypt_hash

PASSWORD = "s3cret-pass"


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def web_file(tmp_path: Path, tls: dict[str, str], *, users: bool = True, mtls: bool = False) -> str:
    text = f"tls_server_config:\n  cert_file: {tls['cert']}\n  key_file: {tls['key']}\n"
    if mtls:
        text += f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {tls['ca']}\n"
    if users:
        text += f"basic_auth_users:\n  prometheus: '{bcrypt_hash(PASSWORD)}'\n"
    text += "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
    return _write(tmp_path / "web.yml", text)


def get(
    url: str, ca: str | None = None, auth: tuple[str, str] | None = None, cert: tuple[str, str] | None = None
) -> tuple[int, bytes, Any]:
    ctx = ssl.create_default_context(cafile=ca) if url.startswith("https") else None
    if ctx is not None and cert is not None:
        ctx.load_cert_chain(*cert)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), exc.headers


def test_https_with_basic_auth_right_wrong_and_missing(serve: Any, tmp_path: Path, tls: dict[str, str]) -> None:
    srv = serve(web_file(tmp_path, tls))
    base = f"https://127.0.0.1:{srv.port}"
    status, body, headers = get(base + "/metrics", tls["ca"], ("prometheus", PASSWORD))
    assert status == 200 and b"gpu_power_watts" in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert get(base + "/metrics", tls["ca"], ("prometheus", "wrong"))[0] == 401
    assert get(base + "/metrics", tls["ca"], ("nobody", PASSWORD))[0] == 401
    status, _, headers = get(base + "/metrics", tls["ca"])
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert get(base + "/metrics", tls["ca"], ("prometheus", ""))[0] == 401
    assert get(base + "/", tls["ca"])[0] == 401
    # probes stay open, over TLS
    assert get(base + "/healthz", tls["ca"])[0] == 200
    assert get(base + "/readyz", tls["ca"])[0] == 200
    # plain HTTP to the TLS port gets no page
    with pytest.raises((OSError, urllib.error.URLError)):
        get(f"http://127.0.0.1:{srv.port}/healthz")
    assert srv.stats.auth_failures == 5


def test_a_checked_pair_is_remembered_right_or_wrong(
    serve: Any, tmp_path: Path, tls: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    srv = serve(web_file(tmp_path, tls))
    for _ in range(5):
        assert get(f"https://127.0.0.1:{srv.port}/metrics", tls["ca"], ("prometheus", PASSWORD))[0] == 200
    assert len(calls) == 1
    for _ in range(3):
        assert get(f"https://127.0.0.1:{srv.port}/metrics", tls["ca"], ("prometheus", "nope"))[0] == 401
        assert get(f"https://127.0.0.1:{srv.port}/metrics", tls["ca"], ("nobody", "nope"))[0] == 401
    assert len(calls) == 3  # a wrong pair sent again costs no bcrypt round, for a known user or not
    assert get(f"https://127.0.0.1:{srv.port}/metrics", tls["ca"], ("prometheus", "other"))[0] == 401
    assert len(calls) == 4  # a pair never seen does


def test_mutual_tls(serve: Any, tmp_path: Path, tls: dict[str, str]) -> None:
    srv = serve(web_file(tmp_path, tls, users=False, mtls=True))
    url = f"https://127.0.0.1:{srv.port}/metrics"
    status, body, _ = get(url, tls["ca"], cert=(tls["client_cert"], tls["client_key"]))
    assert status == 200 and b"gpu_power_watts" in body
    assert get(url, tls["ca"])[0] == 403  # no client certificate (the probe paths stay open: test_web_mtls_probes)


def _peer_cert(port: int, ca: str) -> bytes:
    ctx = ssl.create_default_context(cafile=ca)
    import socket

    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_rotated_certificate_is_served_without_a_restart(serve: Any, tmp_path: Path, tls: dict[str, str]) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(tls["cert"], live / "tls.crt")
    shutil.copy(tls["key"], live / "tls.key")
    path = _write(
        tmp_path / "web.yml", f"tls_server_config:\n  cert_file: {live}/tls.crt\n  key_file: {live}/tls.key\n"
    )
    srv = serve(path)
    first = _peer_cert(srv.port, tls["ca"])
    fresh = make_tls(tmp_path / "fresh")  # another CA and server certificate
    shutil.copy(fresh["key"], live / "tls.key.new")
    shutil.copy(fresh["cert"], live / "tls.crt.new")
    (live / "tls.key.new").rename(live / "tls.key")
    (live / "tls.crt.new").rename(live / "tls.crt")
    assert wait_until(lambda: _try_cert(srv.port, fresh["ca"]) not in (None, first), 10)
    # a rotation to files that do not load keeps the certificate being served
    (live / "tls.crt").write_text("not a certificate\n")
    time.sleep(1.2)
    assert _try_cert(srv.port, fresh["ca"]) is not None


def test_a_certificate_renewed_while_the_server_reads_it_is_served_at_the_next_look(
    tmp_path: Path, tls: dict[str, str]
) -> None:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(tls["cert"], live / "tls.crt")
    shutil.copy(tls["key"], live / "tls.key")
    fresh = make_tls(tmp_path / "fresh")
    renewed: list[bool] = []

    class RenewedAfterTheFirstRead(TlsFiles):
        def build(self) -> ssl.SSLContext:
            ctx = super().build()
            if not renewed:  # cert-manager renews the pair just after the server read it
                shutil.copy(fresh["key"], live / "tls.key")
                shutil.copy(fresh["cert"], live / "tls.crt")
                renewed.append(True)
            return ctx

    state = TlsState(RenewedAfterTheFirstRead(cert_file=str(live / "tls.crt"), key_file=str(live / "tls.key")))
    first = state.context()
    assert wait_until(lambda: state.context() is not first, 5), "the renewed certificate was never loaded"
    assert state.reloads == 1


def _try_cert(port: int, ca: str) -> bytes | None:
    try:
        return _peer_cert(port, ca)
    except (OSError, ssl.SSLError):
        return None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n", "cannot load cert_file"),
        ("tls_server_config:\n  cert_file: {cert}\n", "needs both cert_file and key_file"),
        (
            "tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  client_auth_type: RequireAndVerifyClientCert\n",
            "needs client_ca_file",
        ),
        ("tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n  min_version: TLS99\n", "min_version"),
        ("basic_auth_users:\n  alice: plaintext-password\n", "not a bcrypt hash"),
        ("tls_config:\n  cert_file: x\n", "unknown key 'tls_config'"),
        ("http_server_config:\n  headers:\n    Content-Length: '1'\n", "cannot be set"),
        ("a: &x [1]\nb: *x\n", "anchors and aliases"),
    ],
)
def test_a_bad_web_config_file_is_one_line_and_exit_2(
    tmp_path: Path, tls: dict[str, str], text: str, expected: str
) -> None:
    path = _write(tmp_path / "web.yml", text.format(cert=tls["cert"], key=tls["key"]))
    for command in ((), ("bridge", "--mqtt.url=mqtt://127.0.0.1:1", "--remote-write.url=http://127.0.0.1:1/w")):
        option = "--gpu-vendor=fake" if not command else "--log.level=info"
        assert expected in one_line_exit_2(run_cli(option, f"--web.config.file={path}", command=command))


def _serve_https(log_path: Path, ca: str, port: int, probe: str, *args: str) -> subprocess.Popen[bytes]:
    """The CLI with ``args`` listening on ``port``, once ``probe`` answers 200 over HTTPS."""
    proc = spawn_logged(log_path, *args)

    def up() -> bool:
        try:
            return get(f"https://127.0.0.1:{port}{probe}", ca)[0] == 200
        except OSError:
            return proc.poll() is not None  # exited: stop waiting, the check below tells

    if not (wait_until(up, 20) and proc.poll() is None):
        stop_process(proc)
        raise AssertionError(log_path.read_text())
    return proc


def _agent_over_https(tmp_path: Path, tls: dict[str, str]) -> tuple[subprocess.Popen[bytes], int, Path]:
    """The agent with web_file's TLS and basic auth, ready: (process, port, log file)."""
    port = free_port()
    log_path = tmp_path / "agent.log"
    listen, web = f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={web_file(tmp_path, tls)}"
    return _serve_https(log_path, tls["ca"], port, "/readyz", *FAST, listen, web), port, log_path


def test_prometheus_scrapes_the_agent_over_https_with_basic_auth(tmp_path: Path, tls: dict[str, str]) -> None:
    agent, port, _ = _agent_over_https(tmp_path, tls)
    prometheus = PrometheusServer(tmp_path / "prom", ooo_window=None)
    password_file = _write(tmp_path / "password", PASSWORD)
    (prometheus.workdir / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n"
        "  - job_name: gpu\n"
        "    scheme: https\n"
        f"    tls_config:\n      ca_file: {tls['ca']}\n"
        f"    basic_auth:\n      username: prometheus\n      password_file: {password_file}\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
    )
    try:
        prometheus.start()

        def scraped() -> bool:
            up = prometheus.query('up{job="gpu"}')["result"]
            power = prometheus.query('gpu_power_watts{job="gpu"}')["result"]
            return bool(up) and up[0]["value"][1] == "1" and len(power) == 2

        assert wait_until(scraped, 30), prometheus.log()[-2000:]
    finally:
        prometheus.stop()
        stop_process(agent, timeout=15)


def test_the_bridge_endpoint_takes_the_same_web_config(tmp_path: Path, tls: dict[str, str]) -> None:
    port = free_port()
    log_path = tmp_path / "bridge.log"
    web = f"--web.config.file={web_file(tmp_path, tls)}"
    bridge = _serve_https(log_path, tls["ca"], port, "/healthz", *lone_bridge_args(port), web)
    base = f"https://127.0.0.1:{port}"
    try:
        status, body, _ = get(base + "/metrics", tls["ca"], ("prometheus", PASSWORD))
        assert status == 200 and b"gpu_exporter_bridge_http_connections" in body
        assert get(base + "/metrics", tls["ca"])[0] == 401
        _swap_user(tmp_path / "web.yml", "prometheus", "grafana")  # watched: no signal, no restart
        assert wait_until(lambda: get(base + "/metrics", tls["ca"], ("grafana", PASSWORD))[0] == 200, 10)
        assert get(base + "/metrics", tls["ca"], ("prometheus", PASSWORD))[0] == 401
    finally:
        stop_process(bridge, timeout=20)


def _swap_user(path: Path, old: str, new: str) -> None:
    text = path.read_text().replace(f"  {old}: ", f"  {new}: ")
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.rename(path)


def test_a_changed_web_config_file_is_served_without_a_signal(tmp_path: Path, tls: dict[str, str]) -> None:
    agent, port, log_path = _agent_over_https(tmp_path, tls)
    base = f"https://127.0.0.1:{port}"

    def answers(user: str) -> int:
        try:
            return get(base + "/metrics", tls["ca"], (user, PASSWORD))[0]
        except OSError:
            return 0

    try:
        assert answers("prometheus") == 200
        _swap_user(tmp_path / "web.yml", "prometheus", "grafana")
        assert wait_until(lambda: answers("grafana") == 200, 10), log_path.read_text()
        assert answers("prometheus") == 401
    finally:
        stop_process(agent, timeout=15)
