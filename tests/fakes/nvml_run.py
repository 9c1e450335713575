"""Scenarios through the NVML backend: what it made of them, as data two runs can be compared by.

``run(nv, scenario)`` opens an NvmlBackend over ``nv`` (pynvml, or a SimNvml, whose clock of call costs
then times the calls: slow is what the scenario makes slow, whatever the load), reads the scenario's
cycles and returns the last cycle's samples, the error counts, what was logged, and how the cycles
went (their monotonic start and end and the process's CPU time, the thread that read them, the calls
remembered as slow and how many were started early).

As a program (``python -m tests.fakes.nvml_run SCENARIOS.json``, in an environment made by
``Scenario.environment``), it runs each scenario through the real nvidia-ml-py and prints the list
of results as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceSample

from .nvml_lib import Scenario

__all__ = ["run"]

XID_WAIT = 5.0  # seconds an XID may take to arrive on the backend's event thread


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.msg.startswith("NVML %s:"):  # names the library module: "pynvml" or "simulated"
            self.lines.append(f"{record.levelname} {record.getMessage()}")


def _sample(s: DeviceSample) -> dict[str, Any]:
    return {
        "device": dataclasses.asdict(s.device),
        "up": s.up,
        "info": dict(s.info),
        "values": sorted([key, list(labels), value] for (key, labels), value in s.values.items()),
        "processes": [[p.pid, p.memory_bytes, p.sm_ratio] for p in s.processes],
    }


def run(nv: Any, scenario: Scenario) -> dict[str, Any]:
    clock = getattr(nv, "clock", lambda: float(scenario.elapsed))
    backend = NvmlBackend(
        Config(disabled_collectors=frozenset(scenario.disabled)),
        nvml=nv,
        clock=clock,
        xid_wait_ms=20,
        slow_call_budget=scenario.budget,
        slow_call_timer=nv.timer if isinstance(nv, SimNvml) else time.perf_counter,
    )
    logger = logging.getLogger("gpu_exporter")
    records, level = _Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    cycles: list[list[int]] = []
    samples: list[DeviceSample] = []
    slow: list[list[str]] = []
    try:
        backend.open()
        try:
            deadline = time.monotonic() + XID_WAIT
            while (
                sum(n for i in range(scenario.gpus) for n in backend._xid.read(i)[0].values()) < len(scenario.xids)
                and time.monotonic() < deadline
            ):
                time.sleep(0.01)
            for _ in range(scenario.cycles):
                began, cpu = time.monotonic_ns(), time.process_time_ns()
                samples = backend.read()
                cycles.append([began, time.monotonic_ns(), time.process_time_ns() - cpu])
            slow = sorted([str(key[0]), str(key[1])] for key in backend.slow_calls.slow())
        finally:
            backend.close()
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    return {
        "samples": [_sample(s) for s in samples],
        "errors": dict(backend.errors),
        "log": records.lines,
        "cycles": cycles,
        "thread": threading.get_native_id(),
        "started_early": backend.slow_calls.started_early,
        "slow": slow,  # (scope, call:variant) remembered as slow after the last cycle
    }


def main() -> int:
    import pynvml

    results = []
    for job in json.loads(Path(sys.argv[1]).read_text()):
        for name in [k for k in os.environ if k.startswith("FAKE_NVML_")]:
            del os.environ[name]
        os.environ.update(job["env"])  # read by the library at nvmlInit
        results.append(run(pynvml, Scenario.from_json(job["scenario"])))
    json.dump(results, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
