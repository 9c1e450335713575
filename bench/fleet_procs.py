"""The fleet bench's real processes: Mosquitto, VictoriaMetrics and `gpu-exporter bridge`, each on
127.0.0.1 on a free port with its own directory, stopped by PID; and what /proc says about them.

Mosquitto runs with the shipped cloud broker's settings (deploy/cloud-broker/mosquitto.conf: persistence,
``max_queued_messages 100000``) on one anonymous listener. VictoriaMetrics runs WITHOUT
``-dedup.minScrapeInterval``, so a sample written twice is stored twice and the count check sees it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench_core import stop_process

__all__ = [
    "Bridge",
    "Mosquitto",
    "ProcSampler",
    "Victoria",
    "free_port",
    "machine_busy",
    "scrape",
    "stop_on_signals",
]

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not start within {timeout:g}s")


def _stop(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    """SIGTERM by PID, SIGKILL if it lingers."""
    if proc is not None and proc.poll() is None:
        stop_process(proc, timeout)


_CHILDREN: list[subprocess.Popen[bytes]] = []


def stop_on_signals() -> None:
    """SIGINT or SIGTERM: stop every process the bench started (by PID), then exit."""

    def handler(signum: int, frame: object) -> None:
        for proc in reversed(_CHILDREN):
            if proc.poll() is None:
                proc.terminate()
        for proc in _CHILDREN:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


class _Server:
    def __init__(self, workdir: Path, name: str) -> None:
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / f"{name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def _spawn(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        _CHILDREN.append(self.proc)

    def stop(self) -> None:
        _stop(self.proc)
        self.proc = None


class Mosquitto(_Server):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, "mosquitto")
        lines = [
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            "persistence true",
            f"persistence_location {self.dir}/",
            "autosave_interval 60",
            "max_queued_messages 100000",
            f"log_dest file {self.log}",
            "log_type error",
            "log_type warning",
            "connection_messages false",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to its own user and cannot write its directory
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n")

    def start(self) -> None:
        self._spawn([shutil.which("mosquitto") or "/usr/sbin/mosquitto", "-c", str(self.conf)])

        def up() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True

        _wait(up, 15, "mosquitto")


class Victoria(_Server):
    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, "victoria-metrics")
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._spawn(
            [
                shutil.which("victoria-metrics") or "/usr/bin/victoria-metrics",
                f"-httpListenAddr=127.0.0.1:{self.port}",
                f"-storageDataPath={self.dir / 'data'}",
                "-retentionPeriod=2y",
                "-loggerLevel=ERROR",
            ]
        )
        _wait(lambda: urllib.request.urlopen(self.url + "/health", timeout=1).read(), 60, "victoria-metrics")

    @property
    def write_url(self) -> str:
        return self.url + "/api/v1/write"

    def export(
        self, match: str, start_ms: int, end_ms: int | None = None
    ) -> Iterator[tuple[dict[str, str], list[int]]]:
        """(labels, timestamps in ms) of every series ``match`` selects: raw samples, duplicates included."""
        params = {"match[]": match, "start": f"{start_ms / 1000:.3f}"}
        if end_ms is not None:
            params["end"] = f"{end_ms / 1000:.3f}"
        url = f"{self.url}/api/v1/export?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=120) as resp:
            for line in resp:
                if line.strip():
                    doc = json.loads(line)
                    yield doc["metric"], doc["timestamps"]

    def metric(self, name: str) -> float:
        """Sum of VictoriaMetrics' own ``name`` (all label sets) on its /metrics page."""
        return scrape(self.url + "/metrics", (name,)).get(name, 0.0)


class Bridge(_Server):
    """``gpu-exporter bridge`` from this worktree's src/, as a deployment runs it (its own process)."""

    def __init__(
        self, workdir: Path, index: int, mqtt_url: str, write_url: str, group: str, extra: list[str], src: Path
    ) -> None:
        super().__init__(workdir, f"bridge-{index}")
        self.src = src
        self.client_id = f"bench-bridge-{index}"
        self.argv = [
            sys.executable,
            "-m",
            "gpu_exporter",
            "bridge",
            f"--mqtt.url={mqtt_url}",
            f"--remote-write.url={write_url}",
            f"--bridge.client-id={self.client_id}",
            f"--bridge.listen-address=127.0.0.1:{self.port}",
            *([f"--bridge.group={group}"] if group else []),
            f"--bridge.state-dir={workdir / f'state-{index}'}",  # kept across a kill: the same index
            *extra,
        ]
        self.metrics_url = f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(self.src))
        self._spawn(self.argv, env)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"bridge exited with {self.proc.returncode}: see {self.log}")
            return (
                scrape(self.metrics_url, ("gpu_exporter_bridge_mqtt_connected",)).get(
                    "gpu_exporter_bridge_mqtt_connected", 0.0
                )
                == 1.0
            )

        _wait(ready, 60, "the bridge")

    def kill(self) -> None:
        """SIGKILL: no goodbye, nothing flushed, as an OOM kill or a node loss."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def metrics(self) -> dict[str, float]:
        return scrape(self.metrics_url, _BRIDGE_METRICS)


_BRIDGE_METRICS = (
    "gpu_exporter_bridge_gpu_samples_written_total",
    "gpu_exporter_bridge_samples_written_total",
    "gpu_exporter_bridge_messages_received_total",
    "gpu_exporter_bridge_write_requests_total",
    "gpu_exporter_bridge_queue_messages",
    "gpu_exporter_bridge_lag_seconds",
    "gpu_exporter_bridge_duplicate_samples_total",
    "gpu_exporter_bridge_samples_rejected_total",
    "gpu_exporter_bridge_new_nodes_total",
    "gpu_exporter_bridge_held_back_total",
    "gpu_exporter_bridge_new_nodes_refused_total",
    "gpu_exporter_bridge_series_limited_total",
)


def scrape(url: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum over label sets of each metric in ``names`` on a Prometheus text page."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(url, timeout=30) as resp:
        for raw in resp:
            if raw.startswith(b"#"):
                continue
            line = raw.decode("utf-8", "replace")
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


@dataclass
class Reading:
    t: float  # monotonic
    cpu: float  # seconds, user + system
    rss: int  # bytes
    hwm: int  # peak RSS, bytes


@dataclass
class ProcSampler:
    """Reads /proc/<pid>/stat and status of the given processes every ``period`` seconds."""

    period: float = 1.0
    pids: dict[str, int] = field(default_factory=dict)  # name -> pid (a restarted bridge: a new name)
    readings: dict[str, list[Reading]] = field(default_factory=dict)
    busy: list[tuple[float, float]] = field(default_factory=list)  # (t, machine busy fraction since last)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self.pids[name] = pid
            self.readings.setdefault(name, [])
        self.sample_one(name, pid)

    def forget(self, name: str) -> None:
        with self._lock:
            self.pids.pop(name, None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def sample_one(self, name: str, pid: int) -> Reading | None:
        r = read_proc(pid)
        if r is not None:
            with self._lock:
                self.readings.setdefault(name, []).append(r)
        return r

    def _run(self) -> None:
        last = machine_jiffies()
        while not self._stop.wait(self.period):
            with self._lock:
                pids = dict(self.pids)
            for name, pid in pids.items():
                self.sample_one(name, pid)
            now = machine_jiffies()
            total = now[1] - last[1]
            self.busy.append((time.monotonic(), (now[0] - last[0]) / total if total else 0.0))
            last = now

    def cpu_between(self, name: str, t0: float, t1: float) -> float:
        """CPU seconds ``name`` used between two monotonic times (nearest readings)."""
        rs = self.readings.get(name, [])
        if not rs:
            return 0.0
        a = min(rs, key=lambda r: abs(r.t - t0))
        b = min(rs, key=lambda r: abs(r.t - t1))
        return max(0.0, b.cpu - a.cpu)


def read_proc(pid: int) -> Reading | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/status", "rb") as f:
            status = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime, stime
    rss = hwm = 0
    for line in status.splitlines():
        if line.startswith(b"VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith(b"VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return Reading(time.monotonic(), cpu, rss, hwm)


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def machine_busy(busy: list[tuple[float, float]], t0: float, t1: float) -> float:
    vals = [b for t, b in busy if t0 <= t <= t1]
    return sum(vals) / len(vals) if vals else 0.0
