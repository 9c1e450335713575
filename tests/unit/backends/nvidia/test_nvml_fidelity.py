"""SimNvml against the real wrapper: one scenario set through both, the same result.

Each scenario runs through the NVML backend twice: over SimNvml here, and over the real nvidia-ml-py
loading tests/fakes/fake_nvml.c as libnvidia-ml.so.1 in a child process (tests/fakes/nvml_lib.py).
Both compute the same readings, so what the backend makes of them must be equal: every value, every
absent series, the error counts and the log lines. Where the simulator is kinder than pynvml (hashable
handles, its own exceptions, calls that hold the GIL, other return types), the two part here.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.fakes.nvml_lib import Scenario, run_real
from tests.fakes.nvml_run import run

PCIE = "nvmlDeviceGetPcieThroughput"
ECC = "nvmlDeviceGetTotalEccErrors"

SCENARIOS = {
    "two GPUs": Scenario(gpus=2, seed=3, elapsed=100.0),
    "eight GPUs, later": Scenario(gpus=8, seed=1, elapsed=2500.0),
    "MIG": Scenario(gpus=2, mig=3, elapsed=40.0),
    "faults": Scenario(
        gpus=4,
        lost=(1,),
        fail=(
            (0, "nvmlDeviceGetPowerUsage", 999),  # Unknown: counted, asked again
            (None, "nvmlDeviceGetTemperature", 3),  # NotSupported: absent, not asked again
            (2, PCIE, 15),  # GpuIsLost mid-cycle: GPU 2 down
            (3, "nvmlDeviceGetMemoryInfo", 13),  # FunctionNotFound on one GPU: missing everywhere
        ),
        missing=("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3"),
        processes_per_gpu=2,
        throttle={0: 0.05, 2: 0.5},
    ),
    "no processes, no GPM": Scenario(gpus=2, processes_per_gpu=0, disabled=("gpm",)),
    "XID events": Scenario(gpus=2, xids=((1, 79), (1, 79), (0, 13))),
    "slow calls": Scenario(gpus=2, cost_ms={PCIE: 30, ECC: 10}, cycles=4),
}


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every scenario through the real pynvml, in one child process."""
    results = run_real(list(SCENARIOS.values()), tmp_path_factory.mktemp("nvml"))
    return dict(zip(SCENARIOS, results, strict=True))


@functools.cache
def simulated(name: str) -> dict[str, Any]:
    return run(SCENARIOS[name].sim(), SCENARIOS[name])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_simulator_reads_like_the_real_wrapper(name: str, real: dict[str, Any]) -> None:
    theirs, ours = real[name], simulated(name)
    assert ours["samples"] == theirs["samples"]
    assert ours["errors"] == theirs["errors"]
    assert ours["log"] == theirs["log"]


def test_the_real_wrapper_gives_every_collector_its_values(real: dict[str, Any]) -> None:
    """Not two empty pages agreeing: a full cycle over the C library, every group read."""
    sample = real["two GPUs"]["samples"][0]
    keys = {key for key, _, _ in sample["values"]}
    for key in ("utilization", "memory_used", "temp_memory", "energy", "clock_sm", "clock_event_seconds_power"):
        assert key in keys
    for key in ("pcie_tx", "ecc_corrected_aggregate", "nvlink_tx", "sm_active", "xid_errors", "health"):
        assert key in keys
    assert sample["processes"] and sample["info"]["name"] == "NVIDIA H100 80GB HBM3"
    assert not real["two GPUs"]["errors"] and not real["two GPUs"]["log"]
    faults = real["faults"]
    assert [s["up"] for s in faults["samples"]] == [True, False, False, True]
    assert faults["errors"] == {"nvmlDeviceGetHandleByIndex": 1, "nvmlDeviceGetPowerUsage": 3, PCIE: 1}
    xids = {
        (s["device"]["gpu"], labels[0]): value
        for s in real["XID events"]["samples"]
        for key, labels, value in s["values"]
        if key == "xid_errors"
    }
    assert xids[("1", "79")] == 2 and xids[("0", "13")] == 1


def test_slow_calls_are_started_early_through_both(real: dict[str, Any]) -> None:
    """The calls slower than the budget are remembered per GPU and started early, whatever the handles."""
    ours, theirs = simulated("slow calls"), real["slow calls"]
    expected = {(str(gpu), f"{call}:{variant}") for gpu in range(2) for call, variant in ((PCIE, ""), (ECC, ""))}
    for result in (ours, theirs):
        assert expected <= {tuple(pair) for pair in result["slow"]}
        assert result["started_early"] >= 2 * (2 + 4)  # the last two cycles: 2 PCIe and 4 ECC calls per GPU
