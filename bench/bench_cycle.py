"""Collect-cycle time with slow driver calls, through the real nvidia-ml-py: serial (baseline) against
slow calls started early.

Real drivers spend about 20 ms in each nvmlDeviceGetPcieThroughput call (they sample the link), two
calls per GPU. This script compiles tests/fakes/fake_nvml.c with the system's C compiler into a
temporary folder and loads it as libnvidia-ml.so.1 into the real pynvml, in a child process per case;
the library blocks each PCIe throughput call for --cost seconds (nanosleep: ctypes has released the
GIL, as around the driver's call). The NVML backend reads 8 and 16 simulated GPUs (XID collector off)
with ``slow_call_budget=None`` (every call in line: the baseline) and with the default budget (calls
measured slower start on workers as the cycle begins).

Prints, per case, the median over --repeats child processes (range in brackets) of the medians over
--runs cycles each (after three warm-up cycles; the first two measure):
  cycle   seconds one backend.read() takes;
  CPU     CPU seconds the process spent in it (all threads);
  latest  how long after the cycle began the last library call started (how stale the newest-read
          value is against the sample's timestamp; from the library's call log).

Usage: python bench/bench_cycle.py [--runs 9] [--repeats 3] [--cost 0.02]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.fakes.nvml_lib import Scenario, run_real  # noqa: E402

from figures import figure  # noqa: E402

PCIE = "nvmlDeviceGetPcieThroughput"
WARMUP = 3


def measure(folder: Path, gpus: int, budget: float | None, cost: float, runs: int) -> dict[str, float]:
    log = folder / f"calls-{gpus}-{budget}.log"
    scenario = Scenario(
        gpus=gpus, cost_ms={PCIE: round(cost * 1000)}, cycles=runs + WARMUP, disabled=("xid",), budget=budget
    )
    result: Any = run_real([scenario], folder, log, timeout=600)[0]
    starts = [int(line.split()[3]) for line in log.read_text().splitlines()]
    cycles = result["cycles"][WARMUP:]
    latest = [max(s for s in starts if began <= s <= ended) - began for began, ended, _ in cycles]
    return {
        "cycle": statistics.median(ended - began for began, ended, _ in cycles) / 1e6,
        "cpu": statistics.median(cpu for _, _, cpu in cycles) / 1e6,
        "latest": statistics.median(latest) / 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9, help="measured cycles per case (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="child processes per case (default %(default)s)")
    parser.add_argument("--cost", type=float, default=0.02, help="seconds per PCIe call (default %(default)s)")
    args = parser.parse_args()
    print(f"real nvidia-ml-py over tests/fakes/fake_nvml.c; {PCIE}: {args.cost * 1000:.0f} ms per call, 2 per GPU")
    print(
        f"medians of {args.repeats} x {args.runs} cycles; "
        f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'GPUs':>4}  {'path':<18} {'cycle ms':>19} {'CPU ms':>17} {'latest call start ms':>21} {'ratio':>6}")
    with tempfile.TemporaryDirectory(prefix="bench-cycle-") as tmp:
        for gpus in (8, 16):
            baseline = 0.0
            for label, budget in (("serial (baseline)", None), ("slow calls early", 0.005)):
                runs = [measure(Path(tmp), gpus, budget, args.cost, args.runs) for _ in range(args.repeats)]
                cycle = statistics.median(m["cycle"] for m in runs)
                baseline = baseline or cycle
                print(
                    f"{gpus:>4}  {label:<18} {figure([m['cycle'] for m in runs]):>19}"
                    f" {figure([m['cpu'] for m in runs]):>17} {figure([m['latest'] for m in runs]):>21}"
                    f" {baseline / cycle:>5.1f}x"
                )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
