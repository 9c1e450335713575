"""The signal wiring both daemons share (daemon.py), seen from outside: the bridge re-reads its web config
file when the file changes and on SIGHUP, keeps running through SIGHUP, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support import free_port, http_get, lone_bridge_args, spawn_logged, stop_process, wait_until

pytestmark = pytest.mark.integration  # a real bridge process: run once, with the integration tests

RELOADED = "re-reading the web config file"


def _web_config(path: Path, value: str) -> None:
    path.write_text(f"http_server_config:\n  headers:\n    X-Probe: {value}\n")


def _probe(port: int) -> str | None:
    try:
        status, _, headers = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)
    except OSError:
        return None
    return headers.get("X-Probe") if status == 200 else None


def test_the_bridge_rereads_its_web_config_on_a_change_and_on_sighup_and_stops_on_sigterm(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    _web_config(web, "one")
    port = free_port()
    log_path = tmp_path / "bridge.log"
    bridge = spawn_logged(log_path, *lone_bridge_args(port), f"--web.config.file={web}")
    try:
        assert wait_until(lambda: _probe(port) == "one" or bridge.poll() is not None, 20), log_path.read_text()
        assert log_path.read_text().count(RELOADED) == 0
        _web_config(web, "two, changed")  # another size: the watch sees it within its 2 s
        assert wait_until(lambda: _probe(port) == "two, changed", 15), log_path.read_text()
        assert log_path.read_text().count(RELOADED) == 1

        bridge.send_signal(signal.SIGHUP)
        assert wait_until(lambda: log_path.read_text().count(RELOADED) == 2 or bridge.poll() is not None, 10)
        assert bridge.poll() is None, log_path.read_text()
        assert _probe(port) == "two, changed"
    finally:
        code = stop_process(bridge, timeout=20)
    assert code == 0, log_path.read_text()
    assert "stopping" in log_path.read_text()
