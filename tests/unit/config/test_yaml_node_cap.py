"""A config file within the byte cap but made of a third of a million list items is refused at its cap on
nodes, by the agent and the bridge, at start and at reload, without the parse's cost (before the cap:
10-13 s of CPU and some 225 MB of memory to parse it, over the DaemonSet's 128 Mi limit)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from gpu_exporter import safeyaml
from tests.support import child_env, exporter_cmd, free_port, http_get, lone_bridge_args, spawn_logged, stop_process
from tests.support.waits import wait_until

LIMIT_KIB = 128 * 1024  # the DaemonSet's memory limit
REFUSED = f"more than {safeyaml.MAX_NODES} keys, values and list items"


def _items(path: Path, key: str) -> Path:
    """``key: [1,1,...]``: 330,000 items in 660 kB, under the 1 MiB cap."""
    path.write_text(f"{key}: [" + "1," * 330_000 + "1]\n")
    assert path.stat().st_size < safeyaml.MAX_BYTES
    return path


# Runs the command and writes its peak RSS (KiB) to the file named first. A child forked straight from the
# pytest worker starts out with the worker's resident pages (over 400 MB seen in a full run), which its
# ru_maxrss keeps after the exec; forked from this small process, the peak is the command's own.
_MEASURE = (
    "import os, subprocess, sys\n"
    "proc = subprocess.Popen(sys.argv[2:])\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "open(sys.argv[1], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def _run(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """``gpu-exporter ARGS`` to its end: exit status, stderr, and its peak resident memory in KiB."""
    peak = tmp_path / "peak"
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(peak), *exporter_cmd(*args)],
        env=child_env(),
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        timeout=120,
        check=False,
    )
    return proc.returncode, proc.stderr.decode(), int(peak.read_text())


def _peak_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_the_agent_refuses_it_at_start(tmp_path: Path) -> None:
    conf = _items(tmp_path / "agent.yaml", "metrics.include")
    code, err, peak = _run(tmp_path, f"--config.file={conf}")
    assert code == 2 and err.count("\n") == 1 and REFUSED in err, err
    assert f"{conf}:1" in err
    assert peak < LIMIT_KIB, peak


def test_the_bridge_refuses_it_at_start(tmp_path: Path) -> None:
    web = _items(tmp_path / "web.yml", "basic_auth_users")
    code, err, peak = _run(tmp_path, *lone_bridge_args(free_port()), f"--web.config.file={web}")
    assert code == 2 and err.count("\n") == 1 and REFUSED in err, err
    assert peak < LIMIT_KIB, peak


def test_the_agent_refuses_it_at_reload_and_keeps_serving(tmp_path: Path) -> None:
    conf = tmp_path / "agent.yaml"
    conf.write_text("gpu-vendor: fake\nfake.gpus: 1\n")
    port = free_port()
    log = tmp_path / "agent.log"
    agent = spawn_logged(log, f"--config.file={conf}", f"--web.listen-address=127.0.0.1:{port}")
    try:

        def serves() -> bool:
            try:
                return http_get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)[0] == 200
            except OSError:
                return agent.poll() is not None

        assert wait_until(serves, 20) and agent.poll() is None, log.read_text()
        _items(conf, "metrics.include")
        agent.send_signal(signal.SIGHUP)
        assert wait_until(lambda: REFUSED in log.read_text(), 30), log.read_text()
        assert "keeping the running configuration" in log.read_text()
        assert serves() and agent.poll() is None
        assert _peak_kib(agent.pid) < LIMIT_KIB
    finally:
        assert stop_process(agent, timeout=15) == 0, log.read_text()


def test_the_bridge_refuses_it_at_reload_and_keeps_serving(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Probe: one\n")
    port = free_port()
    log = tmp_path / "bridge.log"
    bridge = spawn_logged(log, *lone_bridge_args(port), f"--web.config.file={web}")
    try:

        def probe() -> str | None:
            try:
                status, _, headers = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2.0)
            except OSError:
                return None
            return headers.get("X-Probe") if status == 200 else None

        assert wait_until(lambda: probe() == "one" or bridge.poll() is not None, 20), log.read_text()
        _items(web, "basic_auth_users")  # the bridge's watch or the SIGHUP reads it
        bridge.send_signal(signal.SIGHUP)
        assert wait_until(lambda: REFUSED in log.read_text(), 30), log.read_text()
        assert "keeping the running web config" in log.read_text()
        assert probe() == "one" and bridge.poll() is None
        assert _peak_kib(bridge.pid) < LIMIT_KIB
    finally:
        assert stop_process(bridge, timeout=15) == 0, log.read_text()
