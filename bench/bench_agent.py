"""The agent's resident memory on a small board's terms: 8 simulated GPUs plus 7 MIG instances read every
second through the real nvidia-ml-py, without forwarding and with it (a real Mosquitto on 127.0.0.1).

The script compiles tests/fakes/fake_nvml.c with the system's C compiler into a temporary folder; each
agent is ``python -m gpu_exporter --gpu-vendor=nvidia`` with that folder on ``LD_LIBRARY_PATH``, so the
real ``pynvml`` loads it as ``libnvidia-ml.so.1`` (the agent's own code, unchanged). The page is scraped
every 15 s, as a Prometheus would. ``--src DIR ...`` runs each named tree's ``src`` instead of this one
(say, ``git archive`` of an earlier commit unpacked there), in turns with the others, so that before and
after are measured side by side under the same load.

Prints, per tree and case, the median VmRSS over ``--runs`` agents (range in brackets) after
``--seconds`` of running (the default ring, 256 samples, fills only after 256 s at this interval), their
peak (VmHWM), and where it goes: what the same interpreter takes to start and do nothing, then as it
imports the agent's layers one after another (the command line, OpenSSL, the rest of the standard
library's HTTP server, prometheus_client, nvidia-ml-py, the backend, the page and the web server). ``--python`` runs
the agents on another interpreter (a virtual environment with only the runtime dependencies, as in the
image: a development interpreter's site hooks can take megabytes of their own).

``--agent-arg=--metrics-buffer-size=2`` (repeatable) passes a flag to every agent.

Usage: python bench/bench_agent.py [--runs 3] [--seconds 30] [--src DIR ...] [--python EXE] [--no-forwarding]
       [--agent-arg FLAG ...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.fakes import nvml_lib  # noqa: E402
from tests.support.ports import free_port  # noqa: E402
from tests.support.procs import stop_process  # noqa: E402
from tests.support.tsdb import MosquittoServer  # noqa: E402

from figures import figure  # noqa: E402

GPUS, MIG = 8, 7
SCRAPE_EVERY = 15.0


def status_kib(pid: int, key: str) -> int:
    """A ``/proc/PID/status`` figure in KiB (VmRSS, VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} for process {pid}")


def scrape(port: int) -> bytes | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return bytes(response.read())
    except OSError:
        return None


def agent_env(lib: Path, src: Path) -> dict[str, str]:
    scenario = nvml_lib.Scenario(gpus=GPUS, mig=MIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPU_EXPORTER_", "FAKE_NVML_", "MALLOC_"))}
    env.update(scenario.environment(nvml_lib.device_nodes(lib / f"dev{GPUS}", GPUS)))
    env.update(LD_LIBRARY_PATH=str(lib), PYTHONPATH=str(src), PYTHONUNBUFFERED="1")
    env.pop("FAKE_NVML_TIME")  # the library's clock runs: readings change from one sample to the next
    return env


def run_agent(python: str, lib: Path, src: Path, seconds: float, extra: list[str], log: Path) -> tuple[int, int]:
    """(VmRSS, VmHWM) in KiB of one agent after ``seconds`` of reading every second."""
    port = free_port()
    args = [
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu-vendor=nvidia",
        "--gpu-metrics-collection-interval=1s",
        "--node-name=bench",
        *extra,
    ]
    with open(log, "ab") as out:
        proc = subprocess.Popen([python, "-m", "gpu_exporter", *args], env=agent_env(lib, src), stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while b"gpu_temperature_celsius" not in (scrape(port) or b""):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the agent did not serve GPUs (exit {proc.poll()}); see {log}")
            time.sleep(0.2)
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(SCRAPE_EVERY, left))
            if scrape(port) is None:
                raise RuntimeError(f"the agent stopped serving; see {log}")
        return status_kib(proc.pid, "VmRSS"), status_kib(proc.pid, "VmHWM")
    finally:
        stop_process(proc)


# What the agent imports, layer by layer, in the order that makes each layer's own cost visible: the
# standard library's HTTP server pulls in OpenSSL (http.client imports ssl) and the email package.
STAGES = (
    ("the command line, config and option tables", "gpu_exporter.cli"),
    ("OpenSSL (ssl, _hashlib)", "ssl, hashlib"),
    ("the rest of http.server (email, http.client)", "http.server"),
    ("prometheus_client", "prometheus_client"),
    ("nvidia-ml-py (pynvml)", "pynvml"),
    ("the NVML backend", "gpu_exporter.backends.nvidia.backend"),
    ("the page and the web server", "gpu_exporter.exposition, gpu_exporter.sampler, gpu_exporter.reload"),
)


def import_stages(python: str, src: Path) -> list[tuple[str, int]]:
    """VmRSS (KiB) after each of ``STAGES`` in one fresh interpreter, its start first."""
    probe = "\n".join(
        [
            "import re",
            "def rss(): return re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1)",
            "print(rss())",
            *(f"import {modules}\nprint(rss())" for _, modules in STAGES),
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, check=True)
    values = [int(v) for v in done.stdout.split()]
    return list(zip(["the interpreter (python -c pass)", *(name for name, _ in STAGES)], values, strict=True))


def mib(values: list[int]) -> str:
    """kB figures (VmRSS) as MiB, median and range."""
    return figure([v / 1024 for v in values])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="agents per tree and case (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long each agent runs (default %(default)s)")
    parser.add_argument("--src", type=Path, nargs="*", default=[], help="further trees' src folders to measure")
    parser.add_argument("--python", default=sys.executable, help="the agents' interpreter (default: this one)")
    parser.add_argument("--agent-arg", action="append", default=[], help="a flag for every agent (repeatable)")
    parser.add_argument("--no-forwarding", action="store_true", help="only the case without forwarding")
    args = parser.parse_args()
    trees = [ROOT / "src", *(p.resolve() for p in args.src)]
    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        work = Path(tmp)
        try:
            nvml_lib.build(work / "lib")
        except RuntimeError as exc:
            print(f"bench_agent: {exc}", file=sys.stderr)
            return 1
        broker = None if args.no_forwarding else MosquittoServer(work / "mqtt")
        if broker is not None:
            broker.start()
        cases: dict[str, list[str]] = {"without forwarding": list(args.agent_arg)}
        try:
            results: dict[tuple[Path, str], list[tuple[int, int]]] = {}
            for run in range(args.runs):
                for tree in trees:
                    if broker is not None:
                        spool = work / f"spool-{run}-{trees.index(tree)}"
                        cases["with forwarding"] = [*args.agent_arg, f"--mqtt.url={broker.url}", f"--spool.dir={spool}"]
                    for case, extra in cases.items():
                        figures = run_agent(args.python, work / "lib", tree, args.seconds, extra, work / "agent.log")
                        results.setdefault((tree, case), []).append(figures)
        finally:
            if broker is not None:
                broker.stop()
    print(
        f"agent RSS: {GPUS} simulated GPUs + {MIG} MIG instances, real nvidia-ml-py over tests/fakes/fake_nvml.c, "
        f"1 s interval, scraped every {SCRAPE_EVERY:g} s; VmRSS after {args.seconds:g} s, median of {args.runs} "
        f"(range), MiB; {args.python} {' '.join(args.agent_arg)}"
    )
    for tree in trees:
        print(f"{tree}:")
        print("  imports, one layer after another (VmRSS, and what the layer added):")
        last = 0
        for name, kib in import_stages(args.python, tree):
            print(f"    {name:48} {kib / 1024:5.1f}  {(kib - last) / 1024 if last else 0:+5.1f}")
            last = kib
        for case in cases:
            rows = results[(tree, case)]
            print(f"  {case:30} {mib([r for r, _ in rows])}   peak {mib([h for _, h in rows])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
