"""Slow NVML calls leave the serial path: measured slow twice, then started on workers as cycles begin.

Mechanism first: which thread made each call, and that the values and the error handling are those
of the serial path; over SimNvml, and once through the real nvidia-ml-py over the C library, whose
device handles are ctypes pointers (unhashable) and whose calls release the GIL. bench/bench_cycle.py
measures the cycle times.

Over SimNvml the backend times calls on the simulator's clock of call costs (``SimNvml.timer``): a call
is slow when the scenario gives it a cost above the budget, never because the machine is loaded (on a
shared machine a 0.1 ms call can take 30 ms of real time). The costs are still slept, so the workers
and the reading thread overlap as over the driver.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.backends.nvidia.slow import SlowCalls
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceSample
from tests.fakes.nvml_lib import Scenario, run_real

PCIE = "nvmlDeviceGetPcieThroughput"
COST = {PCIE: 0.05}  # above the budget below
BUDGET = 0.02
MAIN = threading.current_thread().name
CONFIG = Config(disabled_collectors=frozenset({"xid"}))


def make(budget: float | None = BUDGET, gpus: int = 2) -> tuple[SimNvml, NvmlBackend]:
    sim = SimNvml(gpus=gpus, clock=lambda: 1_700_000_000.0, call_cost=COST)
    backend = NvmlBackend(CONFIG, nvml=sim, slow_call_budget=budget, slow_call_timer=sim.timer)
    backend.open()
    return sim, backend


def measure(backend: NvmlBackend) -> list[DeviceSample]:
    """Two cycles in line: a call is started early once it was slow in two cycles running."""
    backend.read()
    return backend.read()


def pcie(samples: list[DeviceSample]) -> list[tuple[float | None, float | None]]:
    return [(s.values.get(("pcie_tx", ())), s.values.get(("pcie_rx", ()))) for s in samples]


def test_calls_slower_than_the_budget_run_on_workers_with_the_same_values() -> None:
    serial_sim, serial = make(budget=None)
    sim, backend = make()
    try:
        serial.read()  # primes GPM, as the first read below does
        expected = serial.read()
        first = measure(backend)  # every call still in line
        assert sim.call_threads[PCIE] == {MAIN}
        sim.call_threads.clear()
        second = backend.read()
        workers = sim.call_threads[PCIE]
        assert MAIN not in workers and all(name.startswith("nvml-slow") for name in workers)
        assert pcie(first) == pcie(second) == pcie(expected)  # the simulated clock stands still
        assert all(v is not None for pair in pcie(second) for v in pair)
        assert [s.values for s in second] == [s.values for s in expected]  # nothing else differs
        assert serial_sim.call_threads[PCIE] == {MAIN}  # the serial path never uses a worker
    finally:
        serial.close()
        backend.close()


def test_a_gpu_lost_during_an_early_call_is_down_and_the_others_are_read() -> None:
    sim, backend = make()
    try:
        measure(backend)
        sim.fail(1, PCIE, pynvml.NVMLError_GpuIsLost)
        samples = backend.read()
        assert [s.up for s in samples] == [True, False]
        assert backend.errors[PCIE] >= 1
        assert pcie(samples)[0][0] is not None
    finally:
        backend.close()


def test_an_early_call_that_stops_answering_goes_back_in_line_and_its_value_is_absent() -> None:
    sim, backend = make()
    try:
        measure(backend)
        sim.fail(0, PCIE, pynvml.NVMLError_NotSupported)
        samples = backend.read()
        assert pcie(samples)[0] == (None, None)
        assert pcie(samples)[1][0] is not None
        sim.call_threads.clear()
        sim.calls.clear()
        backend.read()
        # not supported on GPU 0: neither asked in line nor started early again
        assert sim.calls[PCIE] == 2
    finally:
        backend.close()


class GatedSim(SimNvml):
    """PCIe throughput calls wait for ``gate`` once it is armed (a driver stuck sampling the link)."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.gate: threading.Event | None = None

    def nvmlDeviceGetPcieThroughput(self, h: object, counter: int) -> int:
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        return super().nvmlDeviceGetPcieThroughput(h, counter)  # type: ignore[arg-type]


def test_the_serial_pass_does_not_wait_for_a_running_early_call() -> None:
    sim = GatedSim(gpus=2, clock=lambda: 1_700_000_000.0, call_cost=COST)
    backend = NvmlBackend(CONFIG, nvml=sim, slow_call_budget=BUDGET, slow_call_timer=sim.timer)
    backend.open()
    try:
        expected = pcie(measure(backend))
        sim.gate = threading.Event()
        sim.calls.clear()
        result: list[list[DeviceSample]] = []
        reader = threading.Thread(target=lambda: result.append(backend.read()))
        reader.start()
        # every read after the PCIe throughput calls, on both GPUs, happens while those calls still wait
        for _ in range(500):
            if sim.calls["nvmlDeviceGetCurrPcieLinkWidth"] == 2 and sim.calls["nvmlDeviceGetRemappedRows"] == 2:
                break
            reader.join(0.01)
        assert sim.calls["nvmlDeviceGetCurrPcieLinkWidth"] == 2 and sim.calls["nvmlDeviceGetRemappedRows"] == 2
        assert reader.is_alive() and not result  # the cycle waits for the early calls at its end
        sim.gate.set()
        reader.join(10)
        assert pcie(result[0]) == expected  # and their values are in the sample
    finally:
        if sim.gate is not None:
            sim.gate.set()
        backend.close()


def test_fake_option_gives_the_simulated_pcie_calls_their_cost() -> None:
    """--fake.pcie-call-duration=20ms makes the simulated PCIe calls block as the driver's do: the backend
    (its real clock, a 5 ms budget) remembers all four of them slow and starts them early; without the
    option it does not (all four slow twice running by a pause of the process is out of reach)."""
    from gpu_exporter.backends.fake import backend as fake
    from gpu_exporter.config import OPTIONS

    option = next(o for o in OPTIONS if o.name == "fake.pcie-call-duration")

    def remembered(config: Config) -> tuple[set[tuple[object, ...]], int]:
        backend = fake.create(config)
        backend.open()
        try:
            for _ in range(3):  # slow in two cycles running, then started early
                backend.read()
            slow = backend.slow_calls
            return {tuple(key[:3]) for key in slow.slow() if str(key[1]).startswith(PCIE)}, slow.started_early
        finally:
            backend.close()

    every = {(gpu, f"{PCIE}:", ("<device handle>", direction)) for gpu in ("0", "1") for direction in (0, 1)}
    assert remembered(Config(gpu_vendor="fake", fake_gpus=2, **{option.field: option.parse("20ms")})) == (every, 4)
    slow, _ = remembered(Config(gpu_vendor="fake", fake_gpus=2))
    assert slow != every


def test_a_call_slow_only_once_goes_back_in_line() -> None:
    """A pause of the process can make any call slow once; its early run shows it is fast."""
    sim, backend = make()
    try:
        measure(backend)  # PCIe calls measured slow
        sim.call_cost[PCIE] = 0.0  # from now on they answer at once (the simulator still notes the threads)
        sim.call_threads.clear()
        backend.read()  # started early, ran fast on the workers: forgotten
        assert MAIN not in sim.call_threads[PCIE]
        sim.call_threads.clear()
        backend.read()
        assert sim.call_threads[PCIE] == {MAIN}
    finally:
        backend.close()


def test_a_call_slow_in_one_cycle_only_stays_in_line() -> None:
    sim, backend = make()
    try:
        backend.read()  # slow in this cycle ...
        sim.call_cost[PCIE] = 0.0  # ... not in the next ones (the simulator still notes the threads)
        sim.call_threads.clear()
        backend.read()
        backend.read()
        assert sim.call_threads[PCIE] == {MAIN}
    finally:
        backend.close()


def test_a_gpu_back_after_a_reset_is_read_early_again_through_its_new_handle() -> None:
    """Its remembered calls held the old handle, which a reset made invalid: they must not be reused."""
    sim = SimNvml(gpus=2, clock=lambda: 1_700_000_000.0, call_cost=COST)
    backend = NvmlBackend(CONFIG, nvml=sim, slow_call_budget=BUDGET, retry_initial=0.0, slow_call_timer=sim.timer)
    backend.open()
    try:
        expected = pcie(measure(backend))
        sim.lose(1)
        assert [s.up for s in backend.read()] == [True, False]
        sim.recover(1)  # new handles; the old ones are an invalid argument now
        for _ in range(3):  # back, then measured slow twice again
            samples = backend.read()
        sim.call_threads.clear()
        samples = backend.read()
        assert [s.up for s in samples] == [True, True]
        assert pcie(samples) == expected
        assert MAIN not in sim.call_threads[PCIE]
    finally:
        backend.close()


def test_through_the_real_pynvml_slow_calls_leave_the_cycle(tmp_path: Path) -> None:
    """8 GPUs whose PCIe throughput calls block 20 ms in the C library: 320 ms a cycle in line.

    Cycles 1-2 make those calls in line, on the reading thread (measured slow twice). In cycles 3-5
    every one of them is made on a worker and none on the reader, each started after its cycle began
    and answered before it ended, and the cycles last less than half as long as the cycles in line
    did (a generous bound: a tenth is usual). Before pynvml's handles were left out of the call's key,
    nothing was ever remembered and every call stayed in line.

    What this asserts is what the code guarantees on any machine, however loaded: the calls are
    submitted as the cycle begins, and the cycle waits for their answers before it ends. When a worker
    then starts its call is the scheduler's choice (on a loaded machine, after the reader has read
    that GPU's other values), so no test may say it starts before any step of the reader; that the
    calls overlap instead of following one another is what the cycles' time shows. The shortest early
    cycle is held to half the shortest in-line cycle of the same run (at least 320 ms), as a bench
    compares best runs: a load that slows both keeps the ratio, and one worker woken 150 ms late (seen
    with the machine's cores busy) lengthens one cycle, not all three.
    """
    gpus, cost = 8, 0.020
    log = tmp_path / "calls.log"
    result = run_real(
        [Scenario(gpus=gpus, cost_ms={PCIE: int(cost * 1000)}, cycles=5, disabled=("xid",))], tmp_path, log
    )[0]
    lines = [line.split() for line in log.read_text().splitlines()]
    pcie_calls = [(int(tid), int(start), int(end)) for call, _, tid, start, end, *_ in lines if call == PCIE]
    cycles, reader = result["cycles"], result["thread"]

    def during(cycle: int) -> list[tuple[int, int, int]]:
        """(thread, start, end) of the PCIe throughput calls that started during a cycle."""
        began, ended, _ = cycles[cycle]
        return [call for call in pcie_calls if began <= call[1] <= ended]

    assert len(pcie_calls) == 5 * 2 * gpus  # none started outside a cycle
    for cycle in (0, 1):  # measured in line, on the reading thread
        assert [tid for tid, _, _ in during(cycle)] == [reader] * 2 * gpus
    for cycle in (2, 3, 4):  # started early, on workers; answered within the cycle
        early = during(cycle)
        assert len(early) == 2 * gpus
        assert reader not in {tid for tid, _, _ in early}
        assert max(end for _, _, end in early) <= cycles[cycle][1]
    assert result["started_early"] >= 3 * 2 * gpus  # more if the load made another call slow twice
    for sample in result["samples"]:
        assert {"pcie_tx", "pcie_rx"} <= {key for key, _, _ in sample["values"]}
    in_line = min(ended - began for began, ended, _ in cycles[:2])
    assert in_line >= 2 * gpus * cost * 1e9
    assert min(ended - began for began, ended, _ in cycles[2:]) < in_line / 2


def test_a_slow_call_whose_arguments_cannot_be_keyed_stays_in_line_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slow = SlowCalls(BUDGET)
    handle = pynvml.c_nvmlDevice_t()  # left out of the key, as every device handle is
    with caplog.at_level(logging.INFO, logger="gpu_exporter.backends.nvml"):
        for _ in range(3):
            slow.observe("0", "nvmlDeviceGetThing:", print, (handle, bytearray(b"x")), {}, handle, 1.0, True)
            slow.observe("0", "nvmlDeviceGetOther:", print, (handle, 1), {}, handle, 1.0, True)
            slow.end()
    assert [name for _, name, *_ in slow.slow()] == ["nvmlDeviceGetOther:"]
    assert [r.getMessage() for r in caplog.records] == [
        "nvmlDeviceGetThing is slow but its arguments cannot be told apart; it stays in line"
    ]


class GatedUtilization(SimNvml):
    """Utilization calls wait for ``gate`` once it is armed."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.gate: threading.Event | None = None

    def nvmlDeviceGetUtilizationRates(self, h: object) -> object:
        if self.gate is not None:
            assert self.gate.wait(10), "the test never opened the gate"
        return super().nvmlDeviceGetUtilizationRates(h)


def test_every_row_of_a_slow_answer_still_running_is_filled_in_at_the_end_of_the_cycle() -> None:
    """utilization and memory_utilization are two rows of one call (SIMPLE_CALLS): when that call, started
    early, is still running as the serial pass reaches it, both values come at the end of the cycle."""
    util = "nvmlDeviceGetUtilizationRates"
    sim = GatedUtilization(gpus=1, clock=lambda: 1_700_000_000.0, call_cost={util: 0.05})
    backend = NvmlBackend(CONFIG, nvml=sim, slow_call_budget=BUDGET, slow_call_timer=sim.timer)
    backend.open()
    try:
        [expected] = measure(backend)
        keys = [("utilization", ()), ("memory_utilization", ())]
        assert all(key in expected.values for key in keys)
        sim.gate = threading.Event()
        sim.calls.clear()
        result: list[list[DeviceSample]] = []
        reader = threading.Thread(target=lambda: result.append(backend.read()))
        reader.start()
        for _ in range(500):  # the reads after it go on while it waits
            if sim.calls["nvmlDeviceGetRemappedRows"] == 1:
                break
            reader.join(0.01)
        assert sim.calls["nvmlDeviceGetRemappedRows"] == 1 and reader.is_alive()
        sim.gate.set()
        reader.join(10)
        [gpu] = result[0]
        assert [gpu.values.get(key) for key in keys] == [expected.values[key] for key in keys]
        assert sim.calls[util] == 1  # one call for both rows
    finally:
        if sim.gate is not None:
            sim.gate.set()
        backend.close()
