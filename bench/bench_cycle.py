"""Collect-cycle time with slow driver calls: the serial cycle (baseline) against slow calls started early.

Real drivers spend about 20 ms in each nvmlDeviceGetPcieThroughput call (they sample the link), two
calls per GPU. The simulator is given that cost (``SimNvml(call_cost=...)``) and read through the real
NVML backend, at 8 and 16 GPUs, with ``slow_call_budget=None`` (every call in line: the cycle before
this change) and with the default budget (calls measured slower start on workers as the cycle begins).

Prints, per case, medians over --runs cycles (after three warm-up cycles; the first two measure):
  cycle   seconds one backend.read() takes;
  latest  how long after the cycle began the last library call started (how stale the newest-read
          value is against the sample's timestamp).

Usage: python bench/bench_cycle.py [--runs 9] [--cost 0.02]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpu_exporter.backends.fake import SimNvml  # noqa: E402
from gpu_exporter.backends.nvml import NvmlBackend  # noqa: E402
from gpu_exporter.config import Config  # noqa: E402

PCIE = "nvmlDeviceGetPcieThroughput"


class StampedSim(SimNvml):
    """The simulator, noting when each library call started."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: list[float] = []
        self._starts_lock = threading.Lock()

    def _enter(self, call: str, handle: Any = None) -> None:
        with self._starts_lock:
            self.starts.append(time.perf_counter())
        super()._enter(call, handle)


def measure(gpus: int, budget: float | None, cost: float, runs: int) -> tuple[float, float]:
    sim = StampedSim(gpus=gpus, call_cost={PCIE: cost})
    backend = NvmlBackend(Config(disabled_collectors=frozenset({"xid"})), nvml=sim, slow_call_budget=budget)
    backend.open()
    cycles: list[float] = []
    latest: list[float] = []
    try:
        for run in range(runs + 3):
            sim.starts.clear()
            began = time.perf_counter()
            backend.read()
            ended = time.perf_counter()
            if run >= 3:
                cycles.append(ended - began)
                latest.append(max(sim.starts) - began)
    finally:
        backend.close()
    return statistics.median(cycles), statistics.median(latest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9, help="measured cycles per case (default %(default)s)")
    parser.add_argument("--cost", type=float, default=0.02, help="seconds per PCIe call (default %(default)s)")
    args = parser.parse_args()
    print(f"{PCIE}: {args.cost * 1000:.0f} ms per call, 2 calls per GPU; medians of {args.runs} cycles")
    print(f"{'GPUs':>4}  {'path':<28} {'cycle ms':>9} {'latest call start ms':>21}")
    for gpus in (8, 16):
        for label, budget in (("serial (before)", None), ("slow calls early (after)", 0.005)):
            cycle, latest = measure(gpus, budget, args.cost, args.runs)
            print(f"{gpus:>4}  {label:<28} {cycle * 1000:>9.1f} {latest * 1000:>21.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
