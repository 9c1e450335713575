"""Reload without restart: a changed --config.file (watched) and SIGHUP, under scrape and forwarding load."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.reload import Reloader
from tests.support import http_get
from tests.support.agent_proc import Proc
from tests.support.mosquitto import Broker, Collector, wait_until


def _samples(proc: Proc) -> float:
    for line in proc.scrape().splitlines():
        if line.startswith("gpu_exporter_ring_samples "):
            return float(line.split()[1])
    return 0.0


def test_reload_under_load_keeps_ring_batch_and_spool(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "mosquitto", users={"edge-a": "pass-a", "edge-b": "pass-b"})
    broker.start()
    (tmp_path / "pass-a").write_text("pass-a\n")
    (tmp_path / "pass-b").write_text("pass-b\n")
    conf = tmp_path / "config.yaml"
    base = (
        "gpu-vendor: fake\nnode-name: edge-1\n"
        f"mqtt.url: {broker.url}\nspool.dir: {tmp_path / 'spool'}\nmqtt.batch-interval: 1s\n"
    )
    conf.write_text(
        base
        + f"fake.gpus: 2\ngpu-metrics-collection-interval: 200ms\nmqtt.username: edge-a\nmqtt.password-file: {tmp_path / 'pass-a'}\n"
    )
    proc = Proc(tmp_path, f"--config.file={conf}").start()
    stop = threading.Event()
    failures: list[str] = []

    def scrape_load() -> None:  # a scraper that never pauses, during every reload
        while not stop.is_set():
            try:
                status = http_get(f"http://127.0.0.1:{proc.port}/metrics", timeout=5)[0]
                if status != 200:
                    failures.append(str(status))
            except OSError as exc:
                failures.append(str(exc))

    load = threading.Thread(target=scrape_load, daemon=True)
    try:
        with Collector(broker, username="edge-a", password="pass-a") as sub:
            load.start()
            assert wait_until(lambda: sub.count() >= 5, 20), proc.log()
            boot = sub.batches[0].boot
            ring_before = _samples(proc)

            # 1. the watched file changes: filter, interval and MQTT credentials live; the GPU count needs a restart
            conf.write_text(
                base + "gpu-metrics-collection-interval: 300ms\nmetrics.exclude: gpu_power_watts\n"
                f"mqtt.username: edge-b\nmqtt.password-file: {tmp_path / 'pass-b'}\n"
                "fake.gpus: 3\n"
            )
            assert wait_until(lambda: "reloaded the configuration" in proc.log(), 15), proc.log()
            assert "--fake.gpus changed; it needs a restart" in proc.log()
            assert wait_until(lambda: "gpu_power_watts{" not in proc.scrape(), 10)
            assert "gpu_temperature_celsius" in proc.scrape()
            assert _samples(proc) >= ring_before  # the ring was kept
            assert wait_until(lambda: "broker settings changed" in proc.log(), 10), proc.log()
            assert wait_until(lambda: "u'edge-b'" in broker.log(), 10), broker.log()[-2000:]
            # batches keep coming over the new credentials, from the same boot, without a gap
            seen = len(sub.seqs(boot)[boot])
            assert wait_until(lambda: len(sub.seqs(boot)[boot]) >= seen + 10, 30), proc.log()
            seqs = sorted(sub.seqs(boot)[boot])
            assert seqs == list(range(seqs[0], seqs[-1] + 1))
            assert {b.boot for b in sub.batches} == {boot}  # never restarted

            # 2. a bad file on SIGHUP: one error line, the running configuration stays
            conf.write_text("gpu-vendor: [broken\n")
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGHUP)
            assert wait_until(lambda: "reload (SIGHUP) failed" in proc.log(), 10), proc.log()
            assert proc.proc.poll() is None
            assert "gpu_power_watts{" not in proc.scrape()
        assert not failures, failures[:5]
    finally:
        stop.set()
        load.join(10)
        assert proc.stop() == 0
        broker.stop()
    assert "Traceback" not in proc.log()


def test_a_reload_changes_the_mqtt_max_rate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """--mqtt.max-rate is applied by the forwarder on a reload: the reload must hand it on, not keep it."""
    conf = tmp_path / "config.yaml"
    base = "gpu-vendor: fake\nmqtt.url: mqtt://127.0.0.1:1883\n"
    conf.write_text(base + "mqtt.max-rate: 2k\n")
    args = {"config.file": str(conf)}
    applied: list[float] = []
    reloader = Reloader(args, cfg.load(args, {}), [lambda old, new: applied.append(new.mqtt_max_rate)])
    conf.write_text(base + "mqtt.max-rate: 500\n")
    with caplog.at_level(logging.WARNING, "gpu_exporter.reload"):
        assert reloader.reload("test")
    assert applied == [500] and reloader.current.mqtt_max_rate == 500
    assert "needs a restart" not in caplog.text
