"""A thousand SIGHUPs at once, to the agent and to the bridge, as real processes: each goes on serving,
reloads on the next SIGHUP, and stops on SIGTERM. A handler that took a lock (``Event.set()``, a log line)
deadlocked when a signal re-entered it while the main thread held that lock: later SIGHUPs did nothing
and SIGTERM never ended the process."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from tests.support import free_port, http_get, lone_bridge_args, spawn_logged, stop_process, wait_until

pytestmark = pytest.mark.integration

STORM = 1000


def _storm(proc: subprocess.Popen[bytes]) -> None:
    """``STORM`` SIGHUPs from as many senders at once (one sender's signals mostly merge while pending)."""
    script = f"for i in $(seq {STORM}); do kill -HUP {proc.pid} & done; wait"
    subprocess.run(["bash", "-c", script], check=True, timeout=300)


def _serves(port: int) -> bool:
    try:
        return http_get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)[0] == 200
    except OSError:
        return False


def _count(log: Path, text: str) -> int:
    return log.read_text(errors="replace").count(text)


def test_the_agent_survives_a_sighup_storm(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "agent.log"
    agent = spawn_logged(log, "--gpu-vendor=fake", "--fake.gpus=1", f"--web.listen-address=127.0.0.1:{port}")
    try:
        assert wait_until(lambda: _serves(port) or agent.poll() is not None, 20), log.read_text()
        _storm(agent)
        assert wait_until(lambda: _count(log, "received SIGHUP") >= 1, 20), log.read_text()
        seen = _count(log, "received SIGHUP")  # SIGHUPs during a reload make one more: fewer than 1,000
        agent.send_signal(signal.SIGHUP)  # still heard: the next one reloads
        assert wait_until(lambda: _count(log, "received SIGHUP") > seen, 20), log.read_text()
        assert _serves(port)
    finally:
        code = stop_process(agent, timeout=15)
    assert code == 0, log.read_text()
    assert "stopped" in log.read_text() and "Traceback" not in log.read_text()


def test_the_bridge_survives_a_sighup_storm(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Probe: one\n")
    port = free_port()
    log = tmp_path / "bridge.log"
    bridge = spawn_logged(log, *lone_bridge_args(port), f"--web.config.file={web}")
    try:
        assert wait_until(lambda: _serves(port) or bridge.poll() is not None, 20), log.read_text()
        _storm(bridge)
        assert wait_until(lambda: _count(log, "re-reading the web config file") >= 1, 20), log.read_text()
        seen = _count(log, "re-reading the web config file")
        bridge.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _count(log, "re-reading the web config file") > seen, 20), log.read_text()
        assert _serves(port)
    finally:
        code = stop_process(bridge, timeout=15)
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()
