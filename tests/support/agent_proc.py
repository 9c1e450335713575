"""The exporter CLI as a real child process, for the tests that forward over MQTT."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from .mosquitto import wait_until
from .ports import free_port
from .procs import child_env, exporter_cmd, http_get, stop_process

FAST = ["--gpu-vendor=fake", "--fake.gpus=2", "--gpu-metrics-collection-interval=200ms", "--node-name=edge-1"]


class Proc:
    """The exporter CLI as a child process with its log in a file (readable while it runs)."""

    def __init__(self, tmp_path: Path, *args: str, name: str = "exporter", env: dict[str, str] | None = None) -> None:
        self.env = env
        self.port = free_port()
        self.log_path = tmp_path / f"{name}-{self.port}.log"
        self.args = ["--web.listen-address", f"127.0.0.1:{self.port}", *args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(exporter_cmd(*self.args), env=self.env or child_env(), stdout=log, stderr=log)
        assert wait_until(self._ready, 20), f"exporter not ready: {self.log()}"
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"exporter exited with {self.proc.returncode}: {self.log()}")
        try:
            return http_get(f"http://127.0.0.1:{self.port}/readyz", timeout=1)[0] == 200
        except OSError:
            return False

    def scrape(self) -> str:
        status, body, _ = http_get(f"http://127.0.0.1:{self.port}/metrics")
        assert status == 200, body[:500]
        return body.decode()

    def metrics(self) -> dict[str, float]:
        """The forwarder's self-metrics, by series."""
        out = {}
        for line in self.scrape().splitlines():
            if line.startswith("gpu_exporter_forward_"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def metric(self, name: str) -> float:
        return self.metrics().get(name, 0.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        return stop_process(self.proc, sig, 15)
