"""Cost of one collect cycle for the AMD backend (on the fake library) and the Jetson backend (on the
fixture trees): median of several runs, in microseconds per read() call.

    PYTHONPATH=src:. python bench/vendors_read.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.fakes.fake_amdsmi import FakeAmdSmi, mi210, mi300x  # noqa: E402

from gpu_exporter.backends.amd import backend as amd  # noqa: E402
from gpu_exporter.backends.jetson import backend as jetson  # noqa: E402
from gpu_exporter.config import Config  # noqa: E402

RUNS = 7
CALLS = 200


def median_us(read) -> float:  # type: ignore[no-untyped-def]
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(CALLS):
            read()
        runs.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(runs)


def main() -> None:
    for cards in (1, 8):
        backend = amd.create(Config(), smi=FakeAmdSmi([mi300x(i) if i % 2 == 0 else mi210(i) for i in range(cards)]))
        backend.open()
        print(f"amd (fake library), {cards} card(s): {median_us(backend.read):.0f} us per read")
    for board in ("nano", "xavier", "orin-jp5", "orin-jp6"):
        root = ROOT / "tests" / "fixtures" / "jetson" / board
        backend = jetson.create(Config(path_sysfs=str(root / "sys"), path_procfs=str(root / "proc")))
        backend.open()
        print(f"jetson {board} (fixture tree): {median_us(backend.read):.0f} us per read")


if __name__ == "__main__":
    main()
