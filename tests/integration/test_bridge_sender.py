"""The remote-write sender against real Prometheus 2.42 and VictoriaMetrics 1.79, and scripted answers."""

from __future__ import annotations

import base64
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.metrics import BridgeMetrics
from gpu_exporter.bridge.remote_write import Series
from gpu_exporter.bridge.sender import RemoteWriter, Stopped, classify
from tests.support.bridge_helpers import ScriptedReceiver, WaitRecorder
from tests.support.tsdb import PrometheusServer, prometheus_fixture, victoria_fixture

pytestmark = pytest.mark.integration


victoria = victoria_fixture()
prometheus = prometheus_fixture("3h")


def _series(name: str, stamps: list[int], node: str = "edge-1", n: int = 3) -> list[Series]:
    return [
        Series(
            (("__name__", name), ("gpu", str(g)), ("node", node)),
            stamps,
            [g * 1000.0 + i * 0.5 for i in range(len(stamps))],
        )
        for g in range(n)
    ]


def _expected(series: list[Series]) -> dict[frozenset[tuple[str, str]], list[tuple[int, float]]]:
    return {frozenset(s.labels): list(zip(s.timestamps, s.values, strict=True)) for s in series}


def _metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("receiver", ["prometheus", "victoria"])
def test_every_sample_lands_with_its_timestamp_across_split_requests(
    receiver: str, request: pytest.FixtureRequest
) -> None:
    server = request.getfixturevalue(receiver)
    now = int(time.time() * 1000)
    stamps = [now - 600_000 + i * 5000 for i in range(100)]  # 10 minutes of 5 s samples
    series = _series(f"t_split_{receiver}", stamps)
    registry = CollectorRegistry()
    writer = RemoteWriter(server.write_url, max_samples=64, metrics=BridgeMetrics(registry))
    outcome = writer.write(series)
    assert (outcome.written, outcome.rejected) == (300, 0)
    assert outcome.requests >= 300 // 64
    assert server.samples(f"t_split_{receiver}") == _expected(series)
    assert _metric(registry, "gpu_exporter_bridge_write_requests_total", code="204") == outcome.requests


def test_prometheus_too_old_samples_are_dropped_and_counted_and_newer_ones_land(
    prometheus: PrometheusServer,
) -> None:
    now = int(time.time() * 1000)
    # A backlog from 5 h ago to now, in one request: the part older than the 3 h window is refused
    # by Prometheus 2.42 with a 500 "too old sample", which must not be retried forever.
    stamps = [now - 5 * 3600_000 + i * 60_000 for i in range(301)]
    series = _series("t_too_old", stamps, n=2)
    registry = CollectorRegistry()
    writer = RemoteWriter(prometheus.write_url, max_samples=10_000, metrics=BridgeMetrics(registry))
    # A Prometheus with current data (an empty head accepts any age): the window counts back from now.
    assert RemoteWriter(prometheus.write_url).write(_series("t_too_old_now", [now], n=1)).written == 1
    outcome = writer.write(series)
    stored = prometheus.samples("t_too_old")
    expected = {k: [p for p in v if p[0] >= now - 3 * 3600_000 + 120_000] for k, v in _expected(series).items()}
    assert stored.keys() == expected.keys()  # both series were stored, not nothing
    for key, points in stored.items():
        assert expected[key] and set(expected[key]) <= set(points)  # every sample inside the window is there
        assert set(points) <= set(_expected(series)[key])
    written = sum(len(v) for v in stored.values())
    assert outcome.written == written and outcome.rejected == 602 - written
    assert written >= 2 * 60 and outcome.rejected >= 2 * 100  # the last ~3 h landed, the first 2 h did not
    assert _metric(registry, "gpu_exporter_bridge_samples_rejected_total", reason="too_old") == outcome.rejected
    assert outcome.requests <= 40  # halving along time (~4 log2 n), not one request per timestamp
    assert _metric(registry, "gpu_exporter_bridge_write_errors_total", reason="server") == 0


def test_prometheus_without_ooo_window_refuses_out_of_order_and_the_writer_moves_on(tmp_path: Path) -> None:
    server = PrometheusServer(tmp_path, ooo_window=None)
    server.start()
    try:
        now = int(time.time() * 1000)
        writer = RemoteWriter(server.write_url)
        assert writer.write(_series("t_ooo", [now], n=1)).written == 1
        late = writer.write(_series("t_ooo", [now - 60_000, now - 30_000], n=1))
        assert (late.written, late.rejected) == (0, 2)
        newer = writer.write(_series("t_ooo", [now + 5000], n=1))
        assert newer.written == 1
        assert [t for t, _ in next(iter(server.samples("t_ooo").values()))] == [now, now + 5000]
    finally:
        server.stop()


def test_server_errors_are_retried_with_backoff_until_they_succeed() -> None:
    def answer(n: int) -> tuple[int, bytes, dict[str, str]]:
        return {1: (503, b"busy", {}), 2: (500, b"internal", {})}.get(n, (204, b"", {}))

    registry = CollectorRegistry()
    with ScriptedReceiver(answer) as rx:
        writer = RemoteWriter(rx.url, backoff_min=0.01, metrics=BridgeMetrics(registry))
        outcome = writer.write(_series("m", [1000, 2000]))
    assert (outcome.written, outcome.requests) == (6, 3)
    assert len(rx.requests) == 3
    assert rx.requests[0].series == rx.requests[2].series  # the same data again
    assert _metric(registry, "gpu_exporter_bridge_write_errors_total", reason="server") == 2


def test_429_is_retried_after_retry_after_and_other_4xx_are_not() -> None:
    def answer(n: int) -> tuple[int, bytes, dict[str, str]]:
        if n == 1:
            return 429, b"slow down", {"Retry-After": "3"}
        if n == 2:
            return 204, b"", {}
        return 401, b"unauthorized", {}

    registry = CollectorRegistry()
    stop = WaitRecorder()
    with ScriptedReceiver(answer) as rx:
        writer = RemoteWriter(rx.url, backoff_min=0.01, metrics=BridgeMetrics(registry), stop=stop)
        assert writer.write(_series("m", [1000])).written == 3
        assert len(stop.waits) == 1 and 0.8 * 3 <= stop.waits[0] <= 3  # the server's 3 s, not the 10 ms backoff
        refused = writer.write(_series("m", [2000, 3000]))
    assert (refused.written, refused.rejected, refused.requests) == (0, 6, 1)
    assert len(rx.requests) == 3
    assert _metric(registry, "gpu_exporter_bridge_samples_rejected_total", reason="client_error") == 6
    assert _metric(registry, "gpu_exporter_bridge_write_errors_total", reason="throttled") == 1


def test_an_unreachable_receiver_keeps_the_writer_retrying_until_stop() -> None:
    stop = threading.Event()
    registry = CollectorRegistry()
    writer = RemoteWriter(
        "http://127.0.0.1:9/api/v1/write",
        timeout=1.0,
        backoff_min=0.01,
        backoff_max=0.05,
        stop=stop,
        metrics=BridgeMetrics(registry),
    )
    threading.Timer(0.5, stop.set).start()
    with pytest.raises(Stopped):
        writer.write(_series("m", [1000]))
    assert _metric(registry, "gpu_exporter_bridge_write_errors_total", reason="network") >= 2


def test_basic_auth_and_bearer_token_headers() -> None:
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        RemoteWriter(rx.url, username="edge", password="s3cret").write(_series("m", [1]))
        RemoteWriter(rx.url, bearer_token="tok").write(_series("m", [1]))
    assert rx.requests[0].headers["Authorization"] == "Basic " + base64.b64encode(b"edge:s3cret").decode()
    assert rx.requests[1].headers["Authorization"] == "Bearer tok"
    for r in rx.requests:
        assert r.headers["Content-Encoding"] == "snappy"
        assert r.headers["Content-Type"] == "application/x-protobuf"
        assert r.headers["X-Prometheus-Remote-Write-Version"] == "0.1.0"


def test_https_with_a_private_ca(tmp_path: Path) -> None:
    import ssl

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        assert rx.server is not None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        rx.server.socket = ctx.wrap_socket(rx.server.socket, server_side=True)
        url = rx.url.replace("http://", "https://")
        assert RemoteWriter(url, ca_file=str(cert)).write(_series("m", [1])).written == 3
        untrusted = RemoteWriter(url, timeout=1.0, backoff_min=0.01, stop=threading.Event())
        timer = threading.Timer(0.3, untrusted._stop.set)
        timer.start()
        with pytest.raises(Stopped):  # an unverified certificate is a network error, retried
            untrusted.write(_series("m", [1]))
    assert len(rx.requests) == 1


@pytest.mark.parametrize(
    ("status", "body", "action", "reason"),
    [
        (500, b"too old sample\n", "refuse", "too_old"),  # Prometheus 2.42 with an out-of-order window
        (400, b"out of bounds\n", "refuse", "too_old"),  # Prometheus without one
        (400, b"out of order sample\n", "refuse", "out_of_order"),
        (400, b"duplicate sample for timestamp\n", "refuse", "duplicate"),
        (
            400,
            b"failed pushing to ingester: user=fleet: the sample has been rejected because its timestamp is too old "
            b"(err-mimir-sample-timestamp-too-old)",
            "refuse",
            "too_old",
        ),
        (
            400,
            b"out-of-order samples are not allowed (err-mimir-sample-out-of-order)",
            "refuse",
            "out_of_order",
        ),
        (503, b"TSDB not ready", "retry", "server"),
        (429, b"", "retry", "throttled"),
        (404, b"404 page not found", "refuse", "client_error"),
        (204, b"", "ok", ""),
    ],
)
def test_answers_of_prometheus_and_mimir_are_classified(status: int, body: bytes, action: str, reason: str) -> None:
    verdict = classify(status, body)
    assert (verdict.action, verdict.reason) == (action, reason)


def test_extra_headers_reach_the_receiver_and_cannot_override_the_protocol_ones() -> None:
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        RemoteWriter(rx.url, headers={"X-Scope-OrgID": "fleet", "Content-Type": "text/plain"}).write(_series("m", [1]))
    assert rx.requests[0].headers["X-Scope-OrgID"] == "fleet"
    assert rx.requests[0].headers["Content-Type"] == "application/x-protobuf"
