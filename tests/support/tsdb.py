"""Real Prometheus, VictoriaMetrics and Mosquitto processes for the bridge tests.

Each server runs on 127.0.0.1 on a free port with its own temporary config and data directory, and is
stopped by its PID. Every wait is bounded by a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .ports import free_port, listens_on
from .waits import wait_until

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
VICTORIA = shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics"
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"

# {frozenset of label pairs: [(timestamp ms, value), ...]}
SampleMap = dict[frozenset[tuple[str, str]], list[tuple[int, float]]]


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


class Server:
    """A child process with a log file, stopped by PID."""

    name = "server"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def write_url(self) -> str:
        """The remote-write endpoint (the same path on Prometheus and VictoriaMetrics)."""
        return self.url + "/api/v1/write"

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            # ready, and on its own port: another test's process may hold the port free_port() gave it
            wait_until(lambda: self._alive() and self.ready() and self._own_port(), timeout, f"{self.name} to be ready")
        except TimeoutError:
            self.stop()
            raise TimeoutError(f"{self.name} did not start; log:\n{self.log()[-3000:]}") from None

    def _own_port(self) -> bool:
        assert self.proc is not None
        return listens_on(self.proc.pid, self.port)

    def _alive(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited; log:\n{self.log()[-3000:]}")
        return True

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.kill(proc.pid, sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout)


class PrometheusServer(Server):
    """Prometheus with the remote-write receiver and an out-of-order window (None: no window)."""

    name = "prometheus"

    def __init__(self, workdir: Path, ooo_window: str | None = "3h") -> None:
        super().__init__(workdir)
        config = "global:\n  scrape_interval: 1m\n"
        if ooo_window:
            config += f"storage:\n  tsdb:\n    out_of_order_time_window: {ooo_window}\n"
        (workdir / "prometheus.yml").write_text(config)

    def command(self) -> list[str]:
        return [
            PROMETHEUS,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-remote-write-receiver",
            "--log.level=warn",
        ]

    def ready(self) -> bool:
        return http_get(self.url + "/-/ready", 2.0).startswith(b"Prometheus Server is Ready")

    def query(self, promql: str, at: float | None = None) -> Any:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = json.loads(http_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"))
        if data.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {data}")
        return data["data"]

    def samples(self, selector: str, window: str = "1d") -> SampleMap:
        """Every raw sample of ``selector`` in the last ``window``, with its stored timestamp."""
        out: SampleMap = {}
        for item in self.query(f"{selector}[{window}]", at=time.time() + 60)["result"]:
            key = frozenset(item["metric"].items())
            out[key] = [(round(float(t) * 1000), float(v)) for t, v in item["values"]]
        return out


class VictoriaMetricsServer(Server):
    name = "victoria-metrics"

    def __init__(self, workdir: Path, retention: str = "1") -> None:
        super().__init__(workdir)
        self.retention = retention

    def command(self) -> list[str]:
        return [
            VICTORIA,
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.workdir / 'data'}",
            f"-retentionPeriod={self.retention}",
            "-loggerLevel=ERROR",
        ]

    def ready(self) -> bool:
        return http_get(self.url + "/health", 2.0).strip() == b"OK"

    def samples(self, selector: str, window: str = "1d") -> SampleMap:
        """Raw samples from /api/v1/export, after forcing recent data to be searchable."""
        http_get(self.url + "/internal/force_flush")
        params = urllib.parse.urlencode(
            {"match[]": selector, "start": f"-{window}", "end": f"{time.time() + 3600:.0f}"}
        )
        out: SampleMap = {}
        for line in http_get(f"{self.url}/api/v1/export?{params}", 30.0).splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key = frozenset(item["metric"].items())
            pairs = list(zip(item["timestamps"], item["values"], strict=True))
            out.setdefault(key, []).extend((int(t), float(v)) for t, v in pairs)
        for points in out.values():
            points.sort()
        return out


class MosquittoServer(Server):
    """Mosquitto 2 with persistence, so that a restart keeps sessions and queued messages."""

    name = "mosquitto"

    def __init__(self, workdir: Path, max_queued: int = 100000) -> None:
        super().__init__(workdir)
        self.config_path = workdir / "mosquitto.conf"
        self.config_path.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {workdir}/\nautosave_interval 1\n"
            f"max_queued_messages {max_queued}\nmax_inflight_messages 100\n"
            f"log_dest stdout\nlog_type error\nlog_type warning\n" + ("user root\n" if os.geteuid() == 0 else "")
            # as root, mosquitto would drop to its own user and could not write its store in tmp_path
        )

    def command(self) -> list[str]:
        return [MOSQUITTO, "-c", str(self.config_path)]

    def ready(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
            return True

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"


def prometheus_fixture(ooo_window: str) -> Any:
    """A module-scoped fixture named ``prometheus``: one real Prometheus with that out-of-order window."""

    @pytest.fixture(scope="module")
    def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
        server = PrometheusServer(tmp_path_factory.mktemp("prom"), ooo_window=ooo_window)
        server.start()
        yield server
        server.stop()

    return prometheus


def mosquitto_fixture() -> Any:
    """A fixture named ``broker``: a plain real Mosquitto of the test's own."""

    @pytest.fixture
    def broker(tmp_path: Path) -> Iterator[MosquittoServer]:
        server = MosquittoServer(tmp_path / "mqtt")
        server.start()
        yield server
        server.stop()

    return broker


def victoria_fixture() -> Any:
    """A module-scoped fixture named ``victoria``: one real VictoriaMetrics."""

    @pytest.fixture(scope="module")
    def victoria(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VictoriaMetricsServer]:
        server = VictoriaMetricsServer(tmp_path_factory.mktemp("vm"))
        server.start()
        yield server
        server.stop()

    return victoria
