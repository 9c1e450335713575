"""This exporter against nvitop-exporter, on the same simulated GPUs (8 GPUs + 7 MIG instances).

nvitop-exporter is installed from PyPI with pip into its own virtual environment (under --cache, by
default ~/.cache/gpu-exporter-bench/nvitop-exporter-<version>), never into this project's environment.
It reads NVML through nvidia-ml-py (``pynvml``), and there is no NVIDIA driver here: a small launcher
replaces pynvml's device and system functions with the simulator this project tests with
(``gpu_exporter.backends.fake.backend.SimNvml``) before nvitop imports it, so both exporters read the same
simulated devices and values. A function the simulator lacks raises NVMLError_NotSupported (nvitop shows
N/A). nvitop looks up its process-listing functions as C function pointers, which a Python simulator
cannot provide: its per-process series are absent, while this exporter's are served. nvitop-exporter
also serves host series (CPU, memory, network) that this exporter leaves to node_exporter.

For each exporter, median of --runs runs:
  * scrape latency p50 and p99 with 4 concurrent clients for --scrape-seconds (gzip asked, as Prometheus);
  * CPU (% of one core) and RSS over --cpu-seconds at a 1 s collection interval, scraped every 15 s.

Usage: python bench/bench_nvitop.py [--runs 3] [--scrape-seconds 10] [--cpu-seconds 30] [--version 1.7.2]
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_core import GPUS, MIG, ROOT, free_port, scrape_clients, start_exporter, steady_usage, stop_process

NVITOP_VERSION = "1.7.2"

# Runs inside nvitop-exporter's virtual environment: argv = gpus, mig instances, nvitop-exporter's own args.
LAUNCHER = """\
import sys

import pynvml

from gpu_exporter.backends.fake.backend import SimNvml

sim = SimNvml(gpus=int(sys.argv[1]), mig=int(sys.argv[2]))


def unsupported(*args, **kwargs):
    raise pynvml.NVMLError_NotSupported()


def not_found(*args, **kwargs):
    raise pynvml.NVMLError_FunctionNotFound()


LIBRARY_CALLS = (
    "nvmlDevice", "nvmlSystem", "nvmlUnit", "nvmlGpm", "nvmlEventSet", "nvmlGpuInstance",
    "nvmlComputeInstance", "nvmlVgpu", "nvmlGetVgpu", "nvmlGetExcluded", "nvmlInit", "nvmlShutdown",
)
for name in list(vars(pynvml)):
    if name.startswith(LIBRARY_CALLS):
        setattr(pynvml, name, getattr(sim, name, unsupported))
pynvml.nvmlInitWithFlags = lambda flags: sim.nvmlInit()
pynvml._nvmlGetFunctionPointer = not_found  # no C library: versioned lookups fall back or report N/A

sys.argv = ["nvitop-exporter", *sys.argv[3:]]
from nvitop_exporter.cli import main  # noqa: E402

sys.exit(main())
"""

Launch = Callable[[], tuple[subprocess.Popen[bytes], int]]


def nvitop_venv(cache: Path, version: str) -> Path:
    """The virtual environment with nvitop-exporter ``version``, created and filled on first use."""
    venv = cache / f"nvitop-exporter-{version}"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists():
        print(f"installing nvitop-exporter {version} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        # PyYAML: the simulator imports this project's config module
        pip = [str(python), "-m", "pip", "install", "--quiet", f"nvitop-exporter=={version}", "PyYAML"]
        subprocess.run(pip, check=True)
        marker.write_text(version)
    (venv / "nvitop_sim.py").write_text(LAUNCHER)
    return venv


def start_nvitop(venv: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [str(venv / "bin" / "python"), str(venv / "nvitop_sim.py"), str(GPUS), str(MIG)]
    cmd += ["--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/metrics")
            page = conn.getresponse().read()
            if page.count(b"\ngpu_utilization_Percentage{") >= GPUS:
                return proc, port
        except OSError:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"nvitop-exporter exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("nvitop-exporter did not serve GPU series within 30 s")


def scrape_latency(launch: Launch, seconds: float, clients: int = 4) -> tuple[float, float, int, int]:
    """p50, p99 (seconds), scrapes, and the uncompressed page size in bytes."""
    proc, port = launch()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    size = len(conn.getresponse().read())
    conn.close()
    latencies = scrape_clients(port, seconds, clients)
    stop_process(proc)
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)], len(latencies), size


def cpu_and_rss(launch: Launch, seconds: float) -> tuple[float, float]:
    """CPU % of one core and RSS (MiB) over ``seconds`` at a 1 s interval, scraped every 15 s."""
    cpu, rss, _ = steady_usage(*launch(), seconds)
    return cpu, rss


def measure(name: str, launch: Launch, args: argparse.Namespace) -> dict[str, float]:
    scrapes = [scrape_latency(launch, args.scrape_seconds) for _ in range(args.runs)]
    usage = [cpu_and_rss(launch, args.cpu_seconds) for _ in range(args.runs)]
    figures = {
        "p50_ms": statistics.median(s[0] for s in scrapes) * 1e3,
        "p99_ms": statistics.median(s[1] for s in scrapes) * 1e3,
        "scrapes": statistics.median(s[2] for s in scrapes),
        "page_kib": statistics.median(s[3] for s in scrapes) / 1024,
        "cpu": statistics.median(u[0] for u in usage),
        "rss": statistics.median(u[1] for u in usage),
    }
    print(
        f"{name:16} p50 {figures['p50_ms']:7.2f} ms  p99 {figures['p99_ms']:7.2f} ms  "
        f"({figures['scrapes']:.0f} scrapes in {args.scrape_seconds:g} s; page {figures['page_kib']:.0f} KiB)  "
        f"CPU {figures['cpu']:5.2f} %  RSS {figures['rss']:5.1f} MiB",
        flush=True,
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scrape-seconds", type=float, default=10)
    parser.add_argument("--cpu-seconds", type=float, default=30)
    parser.add_argument("--version", default=NVITOP_VERSION, help="nvitop-exporter version (default %(default)s)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpu-exporter-bench",
        help="where nvitop-exporter's virtual environment is kept (default %(default)s)",
    )
    args = parser.parse_args()
    venv = nvitop_venv(args.cache, args.version)
    print(
        f"{GPUS} simulated GPUs + {MIG} MIG instances; median of {args.runs} runs; "
        f"latency: 4 concurrent clients, gzip; CPU and RSS: 1 s interval over {args.cpu_seconds:g} s, "
        "simulated library included",
        flush=True,
    )
    ours = measure("gpu-exporter", lambda: start_exporter("1s"), args)
    theirs = measure(f"nvitop-exp {args.version}", lambda: start_nvitop(venv), args)
    print(
        f"nvitop-exporter / gpu-exporter: p50 x{theirs['p50_ms'] / ours['p50_ms']:.1f}, "
        f"p99 x{theirs['p99_ms'] / ours['p99_ms']:.1f}, CPU x{theirs['cpu'] / max(ours['cpu'], 1e-9):.1f}, "
        f"RSS x{theirs['rss'] / ours['rss']:.2f}"
    )


if __name__ == "__main__":
    main()
