"""OpenMetrics for the clients that ask for it, the text format for the others; a Server header that
names no version. Checked with prometheus_client's strict OpenMetrics parser and a real Prometheus
scrape (Prometheus asks for OpenMetrics first)."""

from __future__ import annotations

import gzip
import http.server
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gpu_exporter.openmetrics import accepts_openmetrics, convert
from tests.support import Exporter, child_env, exporter_cmd, free_port, http_get, lone_bridge_args, wait_for
from tests.support.tsdb import PrometheusServer

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize(
    ("header", "openmetrics"),
    [
        (PROMETHEUS_ACCEPT, True),
        ("application/openmetrics-text", True),
        ("application/openmetrics-text; version=0.0.1", True),
        ("application/openmetrics-text; version=2.0.0", False),  # a version we do not write
        ("text/plain;version=0.0.4;q=1,application/openmetrics-text;q=0.5", False),
        ("application/openmetrics-text;q=0", False),
        ("text/plain", False),
        ("*/*", False),
        ("", False),
        (None, False),
        ("garbage;;;q=x", False),
    ],
)
def test_negotiation(header: str | None, openmetrics: bool) -> None:
    assert accepts_openmetrics(header) is openmetrics


TEXT = """\
# HELP gpu_energy_joules_total Energy in joules, "since the driver loaded".
# TYPE gpu_energy_joules_total counter
gpu_energy_joules_total{gpu="0"} 12.5
# HELP odd A counter without the suffix.
# TYPE odd counter
odd 1
# HELP legacy Untyped \\\\ and \\n escapes.
# TYPE legacy untyped
legacy 2
# HELP gpu_up Up.
# TYPE gpu_up gauge
gpu_up{gpu="0"} 1
"""


def test_convert_rewrites_metadata_only() -> None:
    out = convert(TEXT)
    assert out.endswith("\n# EOF\n")
    assert "# TYPE gpu_energy_joules counter\n" in out and '# HELP gpu_energy_joules Energy in joules, \\"since' in out
    assert 'gpu_energy_joules_total{gpu="0"} 12.5\n' in out
    assert "# TYPE odd unknown\n" in out and "# TYPE legacy unknown\n" in out
    families = {f.name: f for f in text_string_to_metric_families(out)}
    assert families["gpu_energy_joules"].type == "counter"
    assert families["gpu_energy_joules"].documentation == 'Energy in joules, "since the driver loaded".'
    assert families["legacy"].documentation == "Untyped \\ and \n escapes."
    assert families["gpu_up"].samples[0].value == 1


def _parse(body: bytes) -> dict[str, Any]:
    text = body.decode()
    assert text.endswith("# EOF\n")
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.mark.integration
def test_agent_negotiates_openmetrics(exporter: type[Exporter]) -> None:
    proc = exporter("--gpu-vendor=fake", "--fake.gpus=2", "--fake.mig=2", "--gpu-metrics-collection-interval=200ms")
    proc.start()
    url = f"http://127.0.0.1:{proc.port}/metrics"
    status, body, headers = http_get(url, {"Accept": PROMETHEUS_ACCEPT})
    assert status == 200 and headers["Content-Type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert "Accept" in headers["Vary"]
    families = _parse(body)
    assert families["gpu_exporter_collects"].type == "counter"
    assert families["gpu_up"].type == "gauge" and len(families["gpu_up"].samples) >= 2
    assert "process_cpu_seconds" in families
    _, zipped, zheaders = http_get(url, {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
    assert zheaders["Content-Encoding"] == "gzip" and _parse(gzip.decompress(zipped))
    # later pages too (made with each sample once a client asked)
    assert wait_for(lambda: http_get(url, {"Accept": PROMETHEUS_ACCEPT})[1] != body, timeout=5)
    _parse(http_get(url, {"Accept": PROMETHEUS_ACCEPT})[1])
    # everyone else: the text format, unchanged
    _, plain, headers = http_get(url)
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b"# EOF" not in plain and b"# TYPE gpu_exporter_collects_total counter" in plain


@pytest.mark.integration
def test_bridge_negotiates_openmetrics() -> None:
    port = free_port()
    proc = subprocess.Popen(exporter_cmd(*lone_bridge_args(port)), env=child_env(), stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def up() -> bool:
            try:
                return http_get(url)[0] == 200
            except OSError:
                return False

        assert wait_for(up, timeout=20)
        _, body, headers = http_get(url, {"Accept": PROMETHEUS_ACCEPT})
        assert headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        assert "gpu_exporter_bridge_build_info" in _parse(body)
        assert b"# EOF" not in http_get(url)[1]
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.integration
def test_server_header_names_no_version(exporter: type[Exporter]) -> None:
    proc = exporter("--gpu-vendor=fake", "--fake.gpus=1").start()
    for path in ("/metrics", "/healthz", "/nope"):
        headers = http_get(f"http://127.0.0.1:{proc.port}{path}")[2]
        assert headers["Server"] == "gpu-exporter", headers


class _Recorder(http.server.BaseHTTPRequestHandler):
    accepts: list[str] = []

    def do_GET(self) -> None:
        type(self).accepts.append(self.headers.get("Accept", ""))
        body = b"# TYPE probe gauge\nprobe 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.integration
def test_a_real_prometheus_scrapes_the_openmetrics_page(exporter: type[Exporter], tmp_path: Path) -> None:
    """Prometheus 2.42 asks for OpenMetrics first (recorded here), gets it, and its strict parser takes it."""
    agent = exporter("--gpu-vendor=fake", "--fake.gpus=2", "--gpu-metrics-collection-interval=200ms").start()
    recorder = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=recorder.serve_forever, daemon=True).start()
    prom = PrometheusServer(tmp_path / "prometheus", ooo_window=None)
    targets = {"agent": agent.port, "recorder": recorder.server_address[1]}
    jobs = "".join(
        f"  - job_name: {job}\n    scrape_interval: 1s\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        for job, port in targets.items()
    )
    (prom.workdir / "prometheus.yml").write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}")
    prom.start()
    try:

        def scraped() -> bool:
            result = prom.query('up{job="agent"} == 1 and on() count(gpu_exporter_collects_total) > 0')["result"]
            return bool(result) and bool(_Recorder.accepts)

        assert wait_for(scraped, timeout=60), prom.log()
        assert accepts_openmetrics(_Recorder.accepts[0]), _Recorder.accepts[0]
        samples = prom.query('scrape_samples_scraped{job="agent"}')["result"]
        assert float(samples[0]["value"][1]) > 50
        assert prom.query('gpu_exporter_build_info{job="agent"}')["result"]
    finally:
        prom.stop()
        recorder.shutdown()
