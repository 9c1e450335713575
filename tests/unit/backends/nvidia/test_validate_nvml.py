"""tools/validate_nvml.py's checks of what the backend relies on, over the simulated library.

The tool runs only on a machine with a real NVIDIA GPU (there it compares with nvidia-smi); these
tests check its own logic: a check passes where the behaviour holds and fails where it does not.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pynvml

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from tests.support import paths

PCIE = "nvmlDeviceGetPcieThroughput"
CONFIG = Config(disabled_collectors=frozenset({"xid"}))


def tool() -> ModuleType:
    path = paths.ROOT / "tools" / "validate_nvml.py"
    spec = importlib.util.spec_from_file_location("validate_nvml", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("validate_nvml", module)
    spec.loader.exec_module(module)
    return module


def read_cycles(keyed: bool = True) -> tuple[list[str], int]:
    validate = tool()
    sim = SimNvml(gpus=2, clock=lambda: 1_700_000_000.0, call_cost={PCIE: 0.02})
    backend = NvmlBackend(CONFIG, nvml=sim)
    if not keyed:  # what the slow-call key did with pynvml's handles before: nothing could be keyed
        backend.slow_calls._key = lambda *args, **kwargs: None  # type: ignore[method-assign]
    backend.open()
    try:
        durations: list[float] = []
        for _ in range(2 + validate.SLOW_CYCLES):
            validate.timed_read(backend, durations)
        lines, failures = validate.check_slow_calls(sim, backend, durations)
        return lines, failures
    finally:
        backend.close()


def test_slow_call_check_passes_where_slow_calls_leave_the_cycle() -> None:
    lines, failures = read_cycles()
    text = "\n".join(lines)
    assert failures == 0, text
    assert "handles hashable: no" in text
    assert f"{PCIE} (GPU 0), {PCIE} (GPU 1)" in text


def test_slow_call_check_fails_where_they_stay_in_line() -> None:
    lines, failures = read_cycles(keyed=False)
    assert failures == 1
    assert f"- FAIL: {PCIE} is slower than the budget but was not remembered" in lines


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def violations(share: float) -> tuple[list[str], int]:
    validate = tool()
    clock = Clock()
    sim = SimNvml(gpus=1, clock=clock, throttle={pynvml.NVML_PERF_POLICY_POWER: share})
    backend = NvmlBackend(CONFIG, nvml=sim, clock=clock)
    backend.open()
    try:
        clock.now += 10
        first = backend.read()
        clock.now += 1
        second = backend.read()
        return validate.check_violations(sim, first, second, 1.0)
    finally:
        backend.close()


def test_violation_check_passes_for_a_counter_of_throttled_time() -> None:
    lines, failures = violations(0.5)
    assert failures == 0, "\n".join(lines)
    assert "| 0 | power | 5.500 s | 5.000 | 5.500 | 0.500 | yes |" in lines
    assert "| 0 | thermal | Not Supported | None | None | - | yes |" in lines


def test_violation_check_fails_for_a_counter_faster_than_time() -> None:
    """What a driver counting in another unit than nanoseconds would look like."""
    lines, failures = violations(1000.0)
    assert failures == 1
    assert any(line.startswith("| 0 | power |") and line.endswith("| NO |") for line in lines)
