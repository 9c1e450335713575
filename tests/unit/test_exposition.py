"""The rendered page: golden text, promtool, filters, escaping, and the HTTP endpoint."""

from __future__ import annotations

import gzip

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.exposition import AgentCollector, Exposition, MetricsServer, native_view, render
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.ring import RingBuffer
from gpu_exporter.sampler import Sampler
from tests.support import check_golden, http_get, promtool_check
from tests.support.samples import fixed_sample


def test_golden_page_two_gpus_with_mig() -> None:
    check_golden("nvidia_sim_2gpu_2mig.prom", render(fixed_sample(), native_view()))


def test_page_passes_promtool_with_agent_metrics() -> None:
    sim = SimNvml(gpus=2, mig=3)
    backend = NvmlBackend(Config(), nvml=sim, xid_wait_ms=20)
    backend.open()
    try:
        ring = RingBuffer(4)
        registry = CollectorRegistry(auto_describe=False)
        exposition = Exposition(registry, native_view())
        sampler = Sampler([backend], ring, 1.0, [exposition.update])
        registry.register(AgentCollector(sampler, ring, [backend]))
        sampler.collect_once()
        sampler.collect_once()
        text = exposition.page(False).decode()
    finally:
        backend.close()
    promtool_check(text)
    assert "gpu_exporter_collects_total 2" in text
    assert "gpu_exporter_build_info{build_date=" in text and 'revision="' in text
    assert "gpu_exporter_ring_samples 2" in text
    assert gzip.decompress(exposition.page(True)).decode() == text


def test_include_and_exclude_filter_by_name() -> None:
    sample = fixed_sample(mig=0)
    text = render(sample, native_view(include="^gpu_(power|temperature|up)", exclude="limit"))
    names = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert names == {"gpu_up", "gpu_power_watts", "gpu_temperature_celsius"}


def test_disabled_group_is_not_rendered() -> None:
    config = Config(disabled_collectors=frozenset({"ecc", "xid"}))
    text = render(fixed_sample(mig=0, config=config), native_view(enabled=config.collector_enabled))
    assert "gpu_ecc_errors_total" not in text and "gpu_remapped_rows_total" not in text
    assert "gpu_power_watts" in text


def test_lost_device_has_up_zero_and_no_values() -> None:
    up = DeviceSample(DeviceId("0", "GPU-a"), True, {("power", ()): 100.0}, {"name": "A"})
    down = DeviceSample(DeviceId("1", "GPU-b"), False, {}, {"name": "B"})
    text = render(Sample(1, 0.0, (up, down)), native_view())
    assert 'gpu_up{gpu="1",uuid="GPU-b"} 0' in text
    assert 'gpu_power_watts{gpu="0",uuid="GPU-a"} 100' in text
    assert 'uuid="GPU-b"} 1' not in text.replace("gpu_info", "")
    promtool_check(text)


def test_label_values_are_escaped() -> None:
    odd = DeviceSample(DeviceId("0", 'GPU-"x"\\y'), True, {("temp_gpu", ()): 40.5}, {"name": 'Card "Pro"\nv2'})
    text = render(Sample(1, 0.0, (odd,)), native_view())
    assert 'name="Card \\"Pro\\"\\nv2"' in text
    assert 'gpu_temperature_celsius{gpu="0",uuid="GPU-\\"x\\"\\\\y",sensor="gpu"} 40.5' in text
    promtool_check(text)


def test_http_endpoint_serves_page_gzip_health_and_readiness() -> None:
    registry = CollectorRegistry(auto_describe=False)
    exposition = Exposition(registry, native_view())
    state = {"ready": False}

    def ready() -> tuple[bool, str]:
        return (True, "ready") if state["ready"] else (False, "no sample yet")

    server = MetricsServer("127.0.0.1:0", "/custom", exposition, ready)
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert http_get(base + "/readyz")[0] == 503
        assert http_get(base + "/healthz")[0] == 200
        exposition.update(fixed_sample(mig=0))
        state["ready"] = True
        assert http_get(base + "/readyz")[0] == 200
        status, body, headers = http_get(base + "/custom")
        assert status == 200 and b"gpu_power_watts" in body
        assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
        status, packed, headers = http_get(base + "/custom", {"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        assert gzip.decompress(packed) == body
        assert len(packed) < len(body) / 4
        assert http_get(base + "/metrics")[0] == 404
    finally:
        server.stop()


def test_port_in_use_raises_oserror() -> None:
    exposition = Exposition(CollectorRegistry(), native_view())
    first = MetricsServer("127.0.0.1:0", "/metrics", exposition, lambda: (True, ""))
    try:
        with pytest.raises(OSError):
            MetricsServer(f"127.0.0.1:{first.port}", "/metrics", exposition, lambda: (True, ""))
    finally:
        first.stop()


def test_client_reset_is_not_a_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    import socket
    import struct
    import time

    exposition = Exposition(CollectorRegistry(), native_view())
    server = MetricsServer("127.0.0.1:0", "/metrics", exposition, lambda: (True, ""))
    server.start()
    try:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", server.port)) as conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.sendall(b"GET /metr")  # then reset mid-request
        time.sleep(0.3)
        assert http_get(f"http://127.0.0.1:{server.port}/healthz")[0] == 200
    finally:
        server.stop()
    assert "Traceback" not in capfd.readouterr().err


def test_a_page_is_made_once_per_sample_and_only_when_scraped() -> None:
    """At a 100 ms interval most samples are never scraped: rendering each one (and compressing it) was
    work per cycle that only a scrape needs. Here a page is made for the newest sample, by the first
    scrape after it, once, however many scrapes follow."""
    made: list[int] = []
    exposition = Exposition(CollectorRegistry(), native_view(), [lambda: made.append(1) or ""])
    for seq in range(1, 11):
        sample = fixed_sample(mig=0)
        exposition.update(Sample(seq, sample.timestamp, sample.devices[:1] if seq < 10 else sample.devices))
    assert made == []  # ten samples, no scrape: no page made
    plain = exposition.page(False)
    assert gzip.decompress(exposition.page(True)) == plain == exposition.page(False)
    assert made == [1]
    assert plain.count(b"gpu_up{") == 2  # the newest sample's two GPUs, not the first sample's one
    exposition.update(fixed_sample(mig=0))
    exposition.page(True)
    assert made == [1, 1]
