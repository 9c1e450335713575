"""The exporter and the bridge as real child processes: their command line and environment, HTTP, a
clean stop by PID."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .paths import SRC
from .ports import free_port
from .waits import wait_for


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def exporter_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_exporter", *args]


def http_get(
    url: str, headers: dict[str, str] | None = None, timeout: float = 5.0
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Signal a child by its PID and wait; SIGKILL when it outlives ``timeout``. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return int(proc.returncode)


def lone_bridge_args(port: int) -> list[str]:
    """``bridge`` serving its endpoint on ``port``, its broker and remote write unreachable (port 1)."""
    return [
        "bridge",
        "--mqtt.url=mqtt://127.0.0.1:1",
        "--remote-write.url=http://127.0.0.1:1/api/v1/write",
        f"--bridge.listen-address=127.0.0.1:{port}",
    ]


def spawn_logged(log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``gpu-exporter ARGS`` as a child whose output goes to ``log_path`` (readable while it runs)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(exporter_cmd(*args), env=child_env(), stdout=log, stderr=log)


class Exporter:
    """The exporter CLI as a child process, stopped by PID."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.args = ["--web.listen-address", f"127.0.0.1:{self.port}", *args]
        self.env = env or child_env()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Exporter:
        self.proc = subprocess.Popen(
            exporter_cmd(*self.args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        url = f"http://127.0.0.1:{self.port}/readyz"
        if not wait_for(lambda: self._ready(url), timeout=20):
            self.stop()
            raise AssertionError(f"exporter did not become ready: {self.output()}")
        return self

    def _ready(self, url: str) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"exporter exited early: {self.output()}")
        try:
            return http_get(url, timeout=1)[0] == 200
        except OSError:
            return False

    def scrape(self, path: str = "/metrics") -> str:
        status, body, _ = http_get(f"http://127.0.0.1:{self.port}{path}")
        assert status == 200, body
        return body.decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return stop_process(self.proc, sig, timeout)

    def output(self) -> str:
        if self.proc is None or self.proc.stdout is None:
            return ""
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stdout.read().decode(errors="replace")


# A child may use at most this much address space: a loader that expands aliases or reads /dev/zero
# whole fails with MemoryError (a traceback) instead of growing the test machine to gigabytes.
_MEMORY_CAP = 1 << 30


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_MEMORY_CAP, _MEMORY_CAP))


def run_cli(*args: str, command: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``gpu-exporter [COMMAND] ARGS`` to its end (60 s at most, 1 GiB of address space), output as text."""
    return subprocess.run(
        exporter_cmd(*command, *args),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_cap_memory,
    )


def one_line_exit_2(result: subprocess.CompletedProcess[str]) -> str:
    """Bad input's contract: exit status 2, one line on stderr, no traceback; that line."""
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr[-2000:]
    return result.stderr
