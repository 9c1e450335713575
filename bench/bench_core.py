"""Exporter core figures on simulated 8 GPUs + 7 MIG instances.

Prints:
  1. cost of one collect cycle (backend read, render, gzip), median of many, and the render cost
     against a baseline that builds prometheus_client metric families for the same page;
  2. scrape latency p50/p99 with 4 concurrent keep-alive clients (gzip, as Prometheus asks);
  3. exporter CPU (% of one core) and RSS at a 1 s interval over --cpu-seconds (default 60 s).

  4. RSS once the default ring (--metrics-buffer-size) is full;
  5. (with 1) the cost of the process_* metrics, in CPU time per page: they are read from /proc/self
     when the page is rendered, once per sample, never per scrape.

Usage: python bench/bench_core.py [--runs 3] [--cpu-seconds 60] [--scrape-seconds 10] [--only-full-ring]
       [--only-scrape] (1, 5 and 2 only)
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.core import Metric  # noqa: E402

from gpu_exporter import catalog  # noqa: E402
from gpu_exporter.backends.fake.backend import SimNvml  # noqa: E402
from gpu_exporter.backends.nvidia.backend import NvmlBackend  # noqa: E402
from gpu_exporter.config import Config  # noqa: E402
from gpu_exporter.exposition import native_view, render  # noqa: E402
from gpu_exporter.model import Sample  # noqa: E402

GPUS, MIG = 8, 7
RING = Config().buffer_size  # the default --metrics-buffer-size
TICKS = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TimedSim(SimNvml):
    """The simulator, with the time spent inside 'library' calls added up (to exclude it)."""

    lib_seconds = 0.0

    def __getattribute__(self, name: str):  # type: ignore[no-untyped-def]
        attr = super().__getattribute__(name)
        if not name.startswith("nvml") or not callable(attr):
            return attr

        def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                TimedSim.lib_seconds += time.perf_counter() - t0

        return timed


def baseline_render(sample: Sample) -> bytes:
    """The straightforward way: prometheus_client families built per sample, then generate_latest."""

    class Snapshot:
        def collect(self):  # type: ignore[no-untyped-def]
            for fam in catalog.families():
                base = fam.name.removesuffix("_total") if fam.type == "counter" else fam.name
                out = Metric(base, fam.help, fam.type)
                for ds in sample.devices:
                    labels = dict(ds.device.labels())
                    for m in fam.metrics:
                        for (key, dyn), value in ds.values.items():
                            if key == m.key:
                                full = {**labels, **dict(m.const_labels), **dict(zip(m.labels, dyn, strict=False))}
                                out.add_sample(fam.name, full, value)
                if out.samples:
                    yield out

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Snapshot())  # type: ignore[arg-type]
    return generate_latest(registry)


def collect_cycle(runs: int) -> None:
    import gzip

    sim = TimedSim(gpus=GPUS, mig=MIG)
    backend = NvmlBackend(Config(), nvml=sim, xid_wait_ms=50)
    backend.open()
    view = native_view()
    backend.read()
    reads, libs, renders, gzips, baselines = [], [], [], [], []
    size = zsize = 0
    for _ in range(runs):
        TimedSim.lib_seconds = 0.0
        t0 = time.perf_counter()
        devices = backend.read()
        t1 = time.perf_counter()
        libs.append(TimedSim.lib_seconds)
        reads.append(t1 - t0)
        sample = Sample(1, time.time(), tuple(devices))
        t2 = time.perf_counter()
        text = render(sample, view).encode()
        t3 = time.perf_counter()
        packed = gzip.compress(text, compresslevel=6, mtime=0)
        t4 = time.perf_counter()
        baseline_render(sample)
        t5 = time.perf_counter()
        renders.append(t3 - t2)
        gzips.append(t4 - t3)
        baselines.append(t5 - t4)
        size, zsize = len(text), len(packed)
    backend.close()
    med = statistics.median
    own = med(reads) - med(libs)
    total = own + med(renders) + med(gzips)
    print(f"collect cycle, {GPUS} GPUs + {MIG} MIG, {len(devices)} devices, median of {runs}:")
    print(f"  backend read        {med(reads) * 1e3:7.2f} ms  (of which simulated library {med(libs) * 1e3:.2f} ms)")
    lines = text.count(b"\n")
    print(f"  render page         {med(renders) * 1e3:7.2f} ms  ({size} bytes, {lines} lines)")
    print(f"  gzip page           {med(gzips) * 1e3:7.2f} ms  ({zsize} bytes)")
    print(f"  agent total         {total * 1e3:7.2f} ms per cycle, library time excluded")
    print(f"  baseline render     {med(baselines) * 1e3:7.2f} ms  (prometheus_client families + generate_latest)")
    print(f"  render speed-up     {med(baselines) / med(renders):7.1f}x over the baseline")


def process_metrics_cost(runs: int) -> None:
    """CPU time of rendering the agent's own registry with and without ProcessCollector (thread CPU
    time, robust to a loaded machine), and the bytes it adds to the page."""
    from prometheus_client import ProcessCollector

    bare = CollectorRegistry(auto_describe=False)
    with_process = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=with_process)
    costs: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(runs):
        for name, registry in (("without", bare), ("with", with_process)):
            t0 = time.thread_time()
            for _ in range(20):
                generate_latest(registry)
            costs[name].append((time.thread_time() - t0) / 20)
    med = statistics.median
    extra = med(costs["with"]) - med(costs["without"])
    size = len(generate_latest(with_process)) - len(generate_latest(bare))
    print(f"process_* metrics, median of {runs} x 20 renders (thread CPU time):")
    print(f"  per page            {extra * 1e6:7.1f} us CPU  (+{size} bytes), once per sample; 0 per scrape")


def start_exporter(interval: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_exporter",
            "--gpu-vendor=fake",
            f"--fake.gpus={GPUS}",
            f"--fake.mig={MIG}",
            f"--gpu-metrics-collection-interval={interval}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        env=env,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("exporter did not start")


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM by PID; SIGKILL when it outlives ``timeout``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def scrape_clients(port: int, seconds: float, clients: int = 4) -> list[float]:
    """Sorted latencies (seconds) of gzip scrapes of /metrics by ``clients`` keep-alive clients at once."""
    latencies: list[float] = []
    lock = threading.Lock()
    until = time.monotonic() + seconds

    def client() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        mine = []
        while time.monotonic() < until:
            t0 = time.perf_counter()
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            conn.getresponse().read()
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(latencies)


SCRAPE_CPU: list[float] = []  # exporter CPU seconds per scrape, one entry per run (robust to load)


def scrape_latency(seconds: float, clients: int = 4) -> tuple[float, float, int]:
    proc, port = start_exporter("1s")
    cpu0 = proc_cpu(proc.pid)
    latencies = scrape_clients(port, seconds, clients)
    SCRAPE_CPU.append((proc_cpu(proc.pid) - cpu0) / max(1, len(latencies)))
    stop_process(proc)
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[int(len(latencies) * 0.99)]
    return p50, p99, len(latencies)


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def proc_rss(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def steady_usage(proc: subprocess.Popen[bytes], port: int, seconds: float) -> tuple[float, float, float]:
    """CPU % of one core, RSS and peak RSS (MiB) of ``proc`` over ``seconds`` after a 3 s start-up, with a
    gzip scrape every 15 s (as Prometheus); then it is stopped."""
    time.sleep(3)  # imports and first samples are start-up, not steady state
    cpu0, t0 = proc_cpu(proc.pid), time.monotonic()
    peak = 0.0
    next_scrape = 0.0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() >= next_scrape:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            conn.getresponse().read()
            next_scrape = time.monotonic() + 15
        peak = max(peak, proc_rss(proc.pid))
        time.sleep(0.5)
    cpu = (proc_cpu(proc.pid) - cpu0) / (time.monotonic() - t0) * 100
    rss = proc_rss(proc.pid)
    stop_process(proc)
    return cpu, rss, peak


def cpu_and_rss(seconds: float) -> tuple[float, float, float]:
    """CPU % of one core over ``seconds`` at a 1 s interval, with a scrape every 15 s (as Prometheus)."""
    return steady_usage(*start_exporter("1s"), seconds)


def full_ring_rss() -> tuple[float, float]:
    """RSS once the default ring is full (filled fast at a 100 ms interval), and before."""
    proc, port = start_exporter("100ms")
    time.sleep(5)
    early = proc_rss(proc.pid)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        page = conn.getresponse().read().decode()
        if "gpu_exporter_ring_overwritten_total 0.0" not in page and f"gpu_exporter_ring_samples {RING:.1f}" in page:
            break
        time.sleep(2)
    time.sleep(5)
    full = proc_rss(proc.pid)
    stop_process(proc)
    return early, full


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cpu-seconds", type=float, default=60)
    parser.add_argument("--scrape-seconds", type=float, default=10)
    parser.add_argument("--only-full-ring", action="store_true", help="run only the full-ring RSS stage")
    parser.add_argument("--only-scrape", action="store_true", help="collect cycle, process_* cost and scrapes only")
    args = parser.parse_args()
    if args.only_full_ring:
        early, full = full_ring_rss()
        print(f"RSS with the default {RING}-sample ring: {early:.1f} MiB after 5 s, {full:.1f} MiB once full")
        return

    collect_cycle(runs=101)
    process_metrics_cost(runs=51)

    results = [scrape_latency(args.scrape_seconds) for _ in range(args.runs)]
    p50 = statistics.median(r[0] for r in results)
    p99 = statistics.median(r[1] for r in results)
    n = statistics.median(r[2] for r in results)
    print(f"scrape latency, 4 concurrent clients, gzip, median of {args.runs} runs of {args.scrape_seconds:g} s:")
    print(f"  p50 {p50 * 1e3:.2f} ms   p99 {p99 * 1e3:.2f} ms   ({n:.0f} scrapes per run)")
    print(f"  exporter CPU per scrape {statistics.median(SCRAPE_CPU) * 1e6:.0f} us (1 s collect cycles included)")
    if args.only_scrape:
        return

    cpu, rss, peak = cpu_and_rss(args.cpu_seconds)
    print(f"exporter at a 1 s interval over {args.cpu_seconds:g} s (scraped every 15 s):")
    print(f"  CPU {cpu:.2f} % of one core (simulated library included)   RSS {rss:.1f} MiB (peak {peak:.1f} MiB)")

    early, full = full_ring_rss()
    print(f"RSS with the default {RING}-sample ring: {early:.1f} MiB after 5 s, {full:.1f} MiB once full")


if __name__ == "__main__":
    main()
