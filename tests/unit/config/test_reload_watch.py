"""Watching the files a daemon reloads (reload.py): a change is seen whenever it is made, even while the
daemon is still starting (between reading a file and starting its watch) or while it reloads."""

from __future__ import annotations

import gc
import logging
import threading
from pathlib import Path

import pytest

from gpu_exporter import cli as agent_cli
from gpu_exporter import config as cfg
from gpu_exporter.bridge import cli as bridge_cli
from gpu_exporter.filewatch import Watched
from gpu_exporter.web import webconfig
from tests.support import free_port, http_get, wait_until


def _web_config(path: Path, value: str) -> None:
    path.write_text(f"http_server_config:\n  headers:\n    X-Probe: {value}\n")


def test_a_change_after_the_baseline_is_seen_once_and_a_change_during_a_reload_is_seen_after_it(
    tmp_path: Path,
) -> None:
    f = tmp_path / "web.yml"
    _web_config(f, "one")
    watched = Watched((str(f),))
    _web_config(f, "two, changed")  # written after the daemon's read, before its first look
    assert watched.changed() == str(f)
    assert watched.changed() is None  # seen once
    _web_config(f, "three, changed again")  # written while the daemon re-reads it
    assert watched.changed() == str(f)
    assert watched.changed() is None
    other = tmp_path / "other.yml"
    other.write_text("x: 1\n")
    assert watched.changed((str(f), str(other))) is None  # a file newly watched: taken as it stands


def test_the_agent_reloads_a_config_file_changed_while_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The exporter run in-process (simulated GPUs); its config file changes right after it read its web
    config file, long before its watch starts: the change is reloaded."""
    port = free_port()
    web = tmp_path / "web.yml"
    _web_config(web, "one")
    conf = tmp_path / "config.yaml"
    base = f"gpu-vendor: fake\nfake.gpus: 1\nweb.listen-address: 127.0.0.1:{port}\nweb.config.file: {web}\n"
    conf.write_text(base + "gpu-metrics-collection-interval: 1s\n")
    args = {"config.file": str(conf)}
    config = cfg.load(args, environ={})
    real = webconfig.load_web_config

    def read_then_changed(path: str) -> webconfig.WebConfig:
        loaded = real(path)
        conf.write_text(base + "gpu-metrics-collection-interval: 2s\n")  # while the exporter starts up
        return loaded

    monkeypatch.setattr(webconfig, "load_web_config", read_then_changed)  # the exporter's reads from here on
    caplog.set_level(logging.INFO, logger="gpu_exporter.reload")
    stop = threading.Event()
    daemon = threading.Thread(target=agent_cli.run, args=(config, stop, args))
    daemon.start()
    try:
        reloaded = wait_until(lambda: "reloaded the configuration" in caplog.text, 10)
    finally:
        stop.set()
        daemon.join(20)
    assert reloaded, "a change made while the exporter started was never reloaded"
    assert "gpu-metrics-collection-interval" in caplog.text  # the option that changed, named
    assert not daemon.is_alive()


def test_the_bridge_serves_a_web_config_changed_while_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    web = tmp_path / "web.yml"
    _web_config(web, "one")
    real = webconfig.load_web_config
    reads: list[str] = []

    def read_then_changed(path: str) -> webconfig.WebConfig:
        loaded = real(path)
        if not reads:  # the bridge's first read; the file changes right after it
            _web_config(web, "two, changed")
        reads.append(path)
        return loaded

    port = free_port()
    config = cfg.load(
        {
            "mqtt.url": "mqtt://127.0.0.1:1",
            "remote-write.url": "http://127.0.0.1:1/api/v1/write",
            "web.config.file": str(web),
        },
        environ={},
    )
    monkeypatch.setattr(webconfig, "load_web_config", read_then_changed)  # the bridge's reads from here on
    stop = threading.Event()
    thresholds = gc.get_threshold()  # the bridge tunes the collector for its process; this one is a test's
    daemon = threading.Thread(
        target=bridge_cli.run, args=(bridge_cli.settings_from(config), f"127.0.0.1:{port}", stop, config)
    )
    daemon.start()

    def probe() -> str | None:
        status, _, headers = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)
        return headers.get("X-Probe") if status == 200 else None

    try:
        assert wait_until(lambda: probe() == "two, changed", 10), (probe(), reads)
    finally:
        stop.set()
        daemon.join(20)
        gc.set_threshold(*thresholds)
    assert not daemon.is_alive()
