"""bench_nvitop.py's rig: the C libnvidia-ml.so.1 both exporters load, nvitop-exporter's virtual
environment, starting either exporter on it, and one measured run of one exporter.

The library is tests/fakes/fake_nvml.c, compiled into a temporary folder and found first through
``LD_LIBRARY_PATH``: nvitop-exporter (through nvidia-ml-py's pynvml, in its own virtual environment) and
this exporter (``--gpu-vendor=nvidia``, the same pynvml) read the same devices natively, process lists
included, with nothing patched in Python. Its clock is frozen (every cycle reads the same values); each
nvmlDeviceGetPcieThroughput call blocks for ``pcie_ms`` (a real driver samples the link for about 20 ms).
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT / "src"), str(ROOT)]

from tests.fakes.nvml_lib import Scenario, build, device_nodes  # noqa: E402

from bench_core import free_port, proc_cpu, proc_rss, stop_process  # noqa: E402

GPUS, MIG, PROCESSES = 8, 7, 2  # MIG instances on GPU 0; compute processes per GPU and per MIG instance
PCIE = "nvmlDeviceGetPcieThroughput"
START_TIMEOUT = 60.0
WARMUP = 3.0  # seconds after the first full page: imports and first cycles are start-up, not steady state
SCRAPE_EVERY = 15.0  # seconds between scrapes while CPU and RSS are measured (Prometheus's default)


class RunFailed(Exception):
    """The exporter exited during a run (or never served a full page); the message says how."""


@dataclass(frozen=True)
class Exporter:
    name: str
    command: list[str]
    env: dict[str, str]
    gpu_series: bytes  # a series every GPU has: the page is full once it appears GPUS times


@dataclass(frozen=True)
class Run:
    """One exporter process: latencies in seconds, CPU in % of one core, RSS in MiB, sizes in bytes."""

    gzip_p50: float
    gzip_p99: float
    gzip_scrapes: int
    gzip_failed: int  # scrapes without an answer (connection closed or reset, timeout)
    plain_p50: float
    plain_p99: float
    plain_scrapes: int
    plain_failed: int
    cpu: float
    rss: float
    scrape_cpu: float  # exporter CPU seconds per scrape while 4 clients scrape (gzip), collect included
    page: int
    page_gzip: int  # as served to a client that asks for gzip
    series: int


def library(folder: Path, pcie_ms: int) -> dict[str, str]:
    """Build the library into ``folder``; the environment that makes a child process load it as the
    driver's, with GPUS GPUs (MIG instances on GPU 0) and PROCESSES processes on each."""
    build(folder)
    scenario = Scenario(gpus=GPUS, mig=MIG, processes_per_gpu=PROCESSES, cost_ms={PCIE: pcie_ms} if pcie_ms else {})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "GPU_EXPORTER_"))}
    env.update(scenario.environment(device_nodes(folder / f"dev{GPUS}", GPUS)), LD_LIBRARY_PATH=str(folder))
    return env


def nvitop_venv(cache: Path, version: str) -> Path:
    """The virtual environment with nvitop-exporter ``version`` (from PyPI, with pip), made on first use."""
    venv = cache / f"nvitop-exporter-{version}"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists():
        print(f"installing nvitop-exporter {version} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", f"nvitop-exporter=={version}"]
        subprocess.run(pip, check=True)
        marker.write_text(version)
    return venv


def ours(env: dict[str, str]) -> Exporter:
    command = [sys.executable, "-m", "gpu_exporter", "--gpu-vendor=nvidia", "--gpu-metrics-collection-interval=1s"]
    command += ["--log.level=warn", "--web.listen-address=127.0.0.1:{port}"]
    return Exporter("gpu-exporter", command, dict(env, PYTHONPATH=str(ROOT / "src")), b"\ngpu_up{")


def nvitop(env: dict[str, str], venv: Path, version: str) -> Exporter:
    command = [str(venv / "bin" / "nvitop-exporter"), "--bind-address", "127.0.0.1", "--port", "{port}"]
    command += ["--interval", "1"]
    env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    return Exporter(f"nvitop-exporter {version}", command, env, b"\ngpu_utilization_Percentage{")


def get(port: int, gzip_ok: bool = False) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"} if gzip_ok else {})
        return conn.getresponse().read()
    finally:
        conn.close()


def start(exporter: Exporter, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The exporter, started (its output into ``log``) and serving a full page (every GPU's series) on a
    free port; RunFailed when it exits first or serves none within START_TIMEOUT."""
    port = free_port()
    command = [part.replace("{port}", str(port)) for part in exporter.command]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env=exporter.env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RunFailed(exited(proc, log))
        try:
            if get(port).count(exporter.gpu_series) >= GPUS:
                return proc, port
        except OSError:
            pass
        time.sleep(0.2)
    stop_process(proc)
    raise RunFailed(f"served no full page within {START_TIMEOUT:g} s (its output: {log})")


def exited(proc: subprocess.Popen[bytes], log: Path) -> str:
    """How the exporter ended: its exit status and the last line it wrote."""
    lines = log.read_text(errors="replace").strip().splitlines()
    return f"exited with status {proc.returncode}; its last line: {lines[-1] if lines else '(none)'} ({log})"


def scrape_clients(
    proc: subprocess.Popen[bytes], port: int, seconds: float, clients: int, gzip_ok: bool
) -> tuple[list[float], int]:
    """Sorted latencies (seconds) of the answered scrapes by ``clients`` keep-alive clients at once, and
    how many got no answer (each client opens a new connection after one)."""
    latencies: list[float] = []
    failed = [0]
    lock = threading.Lock()
    until = time.monotonic() + seconds
    headers = {"Accept-Encoding": "gzip"} if gzip_ok else {}

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        mine: list[float] = []
        lost = 0
        while time.monotonic() < until and proc.poll() is None:
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/metrics", headers=headers)
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                lost += 1
                conn.close()
                continue
            mine.append(time.perf_counter() - t0)
        conn.close()
        with lock:
            latencies.extend(mine)
            failed[0] += lost

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(latencies), failed[0]


def steady(proc: subprocess.Popen[bytes], port: int, seconds: float) -> tuple[float, float]:
    """CPU % of one core over ``seconds`` (one gzip scrape every SCRAPE_EVERY s) and RSS (MiB) after."""
    cpu0, t0 = proc_cpu(proc.pid), time.monotonic()
    next_scrape = t0
    while (now := time.monotonic()) - t0 < seconds:
        if now >= next_scrape:
            get(port, gzip_ok=True)
            next_scrape = now + SCRAPE_EVERY
        time.sleep(min(0.5, max(0.0, seconds - (now - t0))))
    cpu = (proc_cpu(proc.pid) - cpu0) / (time.monotonic() - t0) * 100
    return cpu, proc_rss(proc.pid)


def percentiles(latencies: list[float]) -> tuple[float, float]:
    """p50 and p99 of sorted ``latencies`` (nearest rank); NaN for none."""
    if not latencies:
        return float("nan"), float("nan")
    return latencies[len(latencies) // 2], latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]


def measure(exporter: Exporter, log: Path, cpu_seconds: float, scrape_seconds: float, clients: int = 4) -> Run:
    """One process of ``exporter``: steady CPU and RSS first, then ``clients`` scraping with gzip, then
    without, each for ``scrape_seconds``; the collect cycle runs every second throughout. RunFailed when
    the exporter exits before the end."""
    proc, port = start(exporter, log)
    try:
        time.sleep(WARMUP)
        cpu, rss = steady(proc, port, cpu_seconds)
        plain, packed = get(port), get(port, gzip_ok=True)
        cpu0 = proc_cpu(proc.pid)
        zipped, zipped_failed = scrape_clients(proc, port, scrape_seconds, clients, gzip_ok=True)
        scrape_cpu = (proc_cpu(proc.pid) - cpu0) / max(1, len(zipped))
        unzipped, unzipped_failed = scrape_clients(proc, port, scrape_seconds, clients, gzip_ok=False)
    except OSError as exc:
        if proc.poll() is None:
            stop_process(proc)
            raise RunFailed(f"did not answer: {exc} (its output: {log})") from None
        raise RunFailed(exited(proc, log)) from None
    if proc.poll() is not None:  # it ended on its own during the run
        raise RunFailed(exited(proc, log))
    stop_process(proc)
    series = sum(1 for line in plain.splitlines() if line and not line.startswith(b"#"))
    return Run(
        *percentiles(zipped),
        len(zipped),
        zipped_failed,
        *percentiles(unzipped),
        len(unzipped),
        unzipped_failed,
        cpu,
        rss,
        scrape_cpu,
        len(plain),
        len(packed),
        series,
    )
