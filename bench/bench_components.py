"""CPU per collect cycle, by component, and the whole agent's CPU, on 8 GPUs + 7 MIG instances read
through the real nvidia-ml-py over tests/fakes/fake_nvml.c.

The C library (compiled into a temporary folder, loaded as libnvidia-ml.so.1 by a child process) answers
as a node with 8 H100s, 7 MIG instances on GPU 0 and one compute process per GPU, its clock frozen (every
cycle reads the same values: the encoders' deltas are zero, as on an idle node). Figures are CPU time
(``time.thread_time`` for one component, /proc/<pid>/stat ticks for a process), never wall time: the
machine is shared and its load varies.

1. Components (one child process): the median over --cycles cycles, after warm-up, of one cycle's
   (render, self and gzip: of one page, which the agent makes once per sample a scrape asks for)
     read       NvmlBackend.read() (every default collector, XID events on their own thread);
     bounds     the sampler's label and value bounds (limits.SampleBounds.apply);
     render     the device series as Prometheus text (exposition.render, the native view);
     self       the agent's own metrics (prometheus_client's generate_latest of the agent's registry);
     gzip       the page, compressed as served (level 6);
     prepare    the forwarder's rounding of one sample (forward/prepare.round_values, 4 digits);
     journal    one sample encoded for the spool's journal (payload.encode, level 1) ...
     spool      ... and written to it (Spool.journal, a diskcache in a temporary folder);
     batch      a batch of --batch samples split and encoded for sending (payload.split), per sample.
2. The agent (``python -m gpu_exporter --gpu-vendor=nvidia``), without forwarding and forwarding to a
   real Mosquitto on 127.0.0.1 (tests/support/tsdb.py MosquittoServer), at 1 s and at 100 ms: its CPU
   over a --window-second window after a --warmup, as % of one core, and per cycle (CPU over the cycles
   the agent counted in the window, from two scrapes of gpu_exporter_collects_total). Median of --repeats.

With --against DIR (a checkout of another commit, e.g. ``git worktree add DIR main`` or ``git archive``),
the components of both trees are measured alternately, --rounds times each, and so are the agents
(this tree's and the other's one after the other, --repeats times per case), so that both meet the
same load.

Usage: python bench/bench_components.py [--cycles 200] [--rounds 1] [--against DIR] [--window 30]
       [--warmup 8] [--repeats 3] [--only components|agent]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# the package measured: this tree's, or (--against, in the child) another checkout's src folder
SRC = os.environ.get("BENCH_COMPONENTS_SRC") or str(ROOT / "src")
sys.path[:0] = [SRC, str(ROOT)]

from tests.fakes.nvml_lib import LIBRARY, Scenario, build, device_nodes  # noqa: E402

from figures import figure  # noqa: E402

GPUS, MIG = 8, 7
SCENARIO = Scenario(gpus=GPUS, mig=MIG, processes_per_gpu=1)
COMPONENTS = ("read", "bounds", "render", "self", "gzip", "prepare", "journal", "spool", "batch")
PAGE = ("render", "self", "gzip")  # the page's parts: made once per sample that a scrape asks for
TICK = os.sysconf("SC_CLK_TCK")


def _env(folder: Path, src: str = "") -> dict[str, str]:
    if not (folder / LIBRARY).exists():
        build(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "GPU_EXPORTER_", "BENCH_"))}
    env.update(SCENARIO.environment(device_nodes(folder / f"dev{GPUS}", GPUS)))
    env["LD_LIBRARY_PATH"] = str(folder)
    env["PYTHONPATH"] = os.pathsep.join([src or str(ROOT / "src"), str(ROOT)])
    env["BENCH_COMPONENTS_SRC"] = src
    return env


def _components_run(folder: Path, args: argparse.Namespace, src: str = "") -> dict[str, float]:
    child = [sys.executable, __file__, "--child", f"--cycles={args.cycles}", f"--batch={args.batch}"]
    done = subprocess.run(child, env=_env(folder, src), capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the component run failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout)
    result["cycle"] = sum(result[name] for name in COMPONENTS if name not in PAGE)
    result["page"] = sum(result[name] for name in PAGE)
    return result


def _components_table(folder: Path, args: argparse.Namespace) -> None:
    """This tree's components, or (--against) this tree's and another's, run alternately --rounds times."""
    trees = [("this tree", "")] + ([("against", str(Path(args.against).resolve() / "src"))] if args.against else [])
    runs: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for _ in range(args.rounds):
        for label, src in trees:
            runs[label].append(_components_run(folder, args, src))
    print(
        f"CPU ms per cycle (thread CPU time): median over {args.rounds} run(s) of the medians of {args.cycles} cycles"
    )
    print(f"  {'':<8} " + " ".join(f"{label:>12}" for label, _ in trees))
    for name in (*COMPONENTS, "cycle", "page"):
        cells = [statistics.median(r[name] for r in runs[label]) for label, _ in trees]
        print(f"  {name:<8} " + " ".join(f"{c:12.3f}" for c in cells))
    print("  cycle: what every cycle costs (forwarding included); page: what a scrape of a new sample costs")
    if args.against:
        print(f"  (against: {args.against})")


# -- 1. components, in a child process that has the C library -------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    began = time.thread_time_ns()
    out = fn()
    return (time.thread_time_ns() - began) / 1e6, out


def components(cycles: int, batch_samples: int) -> dict[str, float]:
    """Milliseconds of CPU per cycle for each component (medians); runs where pynvml finds the C library."""
    from prometheus_client import CollectorRegistry, generate_latest

    from gpu_exporter import selfmetrics
    from gpu_exporter.backends.nvidia.backend import NvmlBackend
    from gpu_exporter.config import Config
    from gpu_exporter.exposition import AgentCollector, native_view, render
    from gpu_exporter.forward.prepare import round_values
    from gpu_exporter.forward.spool import Spool
    from gpu_exporter.limits import SampleBounds
    from gpu_exporter.model import Sample
    from gpu_exporter.payload import Batch, encode
    from gpu_exporter.payload.split import split
    from gpu_exporter.ring import RingBuffer
    from gpu_exporter.sampler import Sampler

    backend = NvmlBackend(Config())
    backend.open()
    ring = RingBuffer(256)
    sampler = Sampler([backend], ring, 1.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(sampler, ring, [backend]))
    selfmetrics.register(registry)
    served = selfmetrics.Served(registry)
    view = native_view()
    bounds = SampleBounds()
    times: dict[str, list[float]] = {name: [] for name in COMPONENTS}
    prepared: list[Sample] = []
    journal: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="bench-components-") as tmp:
        spool = Spool(tmp, 256 << 20, 86400.0)
        spool.open()
        try:
            for seq in range(1, cycles + 6):
                ms: dict[str, float] = {}
                ms["read"], devices = _timed(backend.read)
                ms["bounds"], sample = _timed(lambda d=devices, s=seq: bounds.apply(Sample(s, time.time(), tuple(d))))
                ring.append(sample)
                sampler.collects += 1
                ms["render"], text = _timed(lambda s=sample: render(s, view))
                ms["self"], own = _timed(lambda: generate_latest(served))
                page = text.encode() + own
                ms["gzip"], _ = _timed(lambda p=page: gzip.compress(p, compresslevel=6, mtime=0))
                ms["prepare"], ready = _timed(lambda s=sample: round_values(s, 4))
                ms["journal"], data = _timed(lambda r=ready: encode(Batch("node-1", "b" * 32, (r,)), level=1))
                ms["spool"], key = _timed(lambda d=data, s=seq: spool.journal("b" * 32, s, d))
                journal.append(key)
                prepared.append(ready)
                if len(prepared) == batch_samples:
                    batch = Batch("node-1", "b" * 32, tuple(prepared))
                    spent, _ = _timed(lambda b=batch: split(b, 256 << 10, hard=False))
                    times["batch"].append(spent / batch_samples)
                    prepared.clear()
                    spool.forget_journal(journal)
                    journal.clear()
                if seq > 5:  # warm-up: the slow-call budget measures the first cycles
                    for name, value in ms.items():
                        times[name].append(value)
        finally:
            spool.close()
            backend.close()
    return {name: statistics.median(values) if values else float("nan") for name, values in times.items()}


# -- 2. the agent ----------------------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def _collects(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        page = response.read().decode()
    match = re.search(r"^gpu_exporter_collects_total (\S+)$", page, re.M)
    return 0 if match is None else int(float(match.group(1)))  # none before the first sample


def agent(folder: Path, interval: str, mqtt: str, window: float, warmup: float, src: str = "") -> tuple[float, float]:
    """(% of one core, CPU ms per cycle) of one agent run."""
    from tests.support import free_port, stop_process, wait_until

    port = free_port()
    args = [
        sys.executable,
        "-m",
        "gpu_exporter",
        "--gpu-vendor=nvidia",
        f"--gpu-metrics-collection-interval={interval}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--node-name=bench-node",
        "--log.level=warn",
    ]
    spool = folder / f"spool-{time.monotonic_ns()}"
    if mqtt:
        args += [f"--mqtt.url={mqtt}", f"--spool.dir={spool}"]
    proc = subprocess.Popen(args, env=_env(folder, src), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _collects(port) > 0, 30, "the agent's first sample")
        time.sleep(warmup)
        cpu0, n0 = _cpu_seconds(proc.pid), _collects(port)
        time.sleep(window)
        cpu1, n1 = _cpu_seconds(proc.pid), _collects(port)
    finally:
        stop_process(proc)
        shutil.rmtree(spool, ignore_errors=True)
    return 100 * (cpu1 - cpu0) / window, 1000 * (cpu1 - cpu0) / max(1, n1 - n0)


def agents(folder: Path, window: float, warmup: float, repeats: int, against: str = "") -> None:
    """Each case --repeats times; with ``against``, that checkout's agent too, alternately with this one's."""
    from tests.support.tsdb import MosquittoServer

    trees = [("this tree", "")] + ([("against", str(Path(against).resolve() / "src"))] if against else [])
    broker = MosquittoServer(folder / "mosquitto")
    broker.start()
    try:
        print(f"{'interval':>8} {'forwarding':>10} {'tree':>10} {'% of a core':>18} {'CPU ms per cycle':>18}")
        for interval in ("1s", "100ms"):
            for mqtt in ("", broker.url):
                runs: dict[str, list[tuple[float, float]]] = {label: [] for label, _ in trees}
                for _ in range(repeats):
                    for label, src in trees:
                        runs[label].append(agent(folder, interval, mqtt, window, warmup, src))
                for label, _ in trees:
                    pct = [r[0] for r in runs[label]]
                    per = [r[1] for r in runs[label]]
                    print(
                        f"{interval:>8} {'yes' if mqtt else 'no':>10} {label:>10} {figure(pct, 2):>18}"
                        f" {figure(per, 2):>18}",
                        flush=True,
                    )
    finally:
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=200, help="measured cycles (default %(default)s)")
    parser.add_argument("--batch", type=int, default=120, help="samples per forwarded batch (default %(default)s)")
    parser.add_argument("--window", type=float, default=30.0, help="agent CPU window, s (default %(default)s)")
    parser.add_argument("--warmup", type=float, default=8.0, help="agent warm-up, s (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="agent runs per case (default %(default)s)")
    parser.add_argument("--only", choices=("components", "agent"), help="one part only")
    parser.add_argument("--rounds", type=int, default=1, help="component runs (default %(default)s)")
    parser.add_argument(
        "--against", metavar="DIR", help="also a checkout of another commit (its src/), alternately with this one"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # part 1, in the process that loads the C library
        json.dump(components(args.cycles, args.batch), sys.stdout)
        return 0
    print(f"real nvidia-ml-py over tests/fakes/fake_nvml.c: {GPUS} GPUs + {MIG} MIG instances, clock frozen")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="bench-components-") as tmp:
        folder = Path(tmp)
        if args.only != "agent":
            try:
                _components_table(folder, args)
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
        if args.only != "components":
            print(f"the agent: CPU over {args.window:g} s after {args.warmup:g} s, median of {args.repeats} (range)")
            agents(folder, args.window, args.warmup, args.repeats, args.against or "")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
