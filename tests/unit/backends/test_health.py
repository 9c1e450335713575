"""gpu_health{subsystem}: 0 ok, 1 warning, 2 failure, from what the backends already read."""

from __future__ import annotations

import time

import pynvml
import pytest

from gpu_exporter.backends.amd import backend as amd
from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.health import FAILURE, OK, WARNING, XID_HOLD_SECONDS, HealthTracker
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceSample
from tests.fakes.fake_amdsmi import FakeAmdSmi, mi300x, violation_status


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def health(sample: DeviceSample) -> dict[str, float]:
    return {labels[0]: v for (key, labels), v in sample.values.items() if key == "health"}


def make(**sim_kw: object) -> tuple[SimNvml, NvmlBackend, Clock]:
    clock = Clock()
    sim = SimNvml(gpus=2, clock=clock, **sim_kw)  # type: ignore[arg-type]
    backend = NvmlBackend(Config(), nvml=sim, clock=clock, xid_wait_ms=20)
    backend.open()
    return sim, backend, clock


def read_until_xid(backend: NvmlBackend, gpu: int, code: int, timeout: float = 5.0) -> list[DeviceSample]:
    """Read until GPU ``gpu`` counts XID ``code`` (the event thread delivers it a moment after it
    happened), or ``timeout`` passes; the last read."""
    deadline = time.monotonic() + timeout
    samples = backend.read()
    while samples[gpu].values[("xid_errors", (str(code),))] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
        samples = backend.read()
    return samples


def test_simulated_gpus_start_healthy_in_every_subsystem_with_inputs() -> None:
    _, backend, _ = make()
    try:
        for sample in backend.read():
            assert health(sample) == {"xid": OK, "memory": OK, "pcie": OK, "thermal": OK, "power": OK}
    finally:
        backend.close()


def test_xid_79_turns_health_to_failure_and_the_dcgm_last_xid_shows_it() -> None:
    sim, backend, clock = make()
    try:
        backend.read()
        sim.xid(1, 79)
        samples = read_until_xid(backend, 1, 79)
        assert health(samples[1])["xid"] == FAILURE
        assert samples[1].values[("xid_last", ())] == 79
        assert health(samples[0])["xid"] == OK  # the other GPU is fine
        assert samples[0].values[("xid_last", ())] == 0
        clock.now += XID_HOLD_SECONDS + 1  # an hour without a new XID: back to ok
        assert health(backend.read()[1])["xid"] == OK
    finally:
        backend.close()


def test_row_remap_failure_turns_memory_health_to_failure_and_pending_to_warning() -> None:
    sim, backend, _ = make()
    try:
        sim.remapped_rows[0] = (1, 0, 1, 0)  # a remapping waits for the next reset
        assert health(backend.read()[0])["memory"] == WARNING
        sim.remapped_rows[0] = (1, 2, 0, 1)  # the GPU ran out of spare rows
        samples = backend.read()
        assert health(samples[0])["memory"] == FAILURE
        assert health(samples[1])["memory"] == OK
    finally:
        backend.close()


def test_sustained_thermal_throttling_warns_then_fails() -> None:
    sim, backend, clock = make(throttle={pynvml.NVML_PERF_POLICY_THERMAL: 0.2, pynvml.NVML_PERF_POLICY_POWER: 0.0})
    try:
        backend.read()
        for _ in range(12):
            clock.now += 5.0
            sample = backend.read()[0]
        assert health(sample)["thermal"] == WARNING
        assert health(sample)["power"] == OK
        sim.set_throttle(pynvml.NVML_PERF_POLICY_THERMAL, 0.9)
        for _ in range(12):
            clock.now += 5.0
            sample = backend.read()[0]
        assert health(sample)["thermal"] == FAILURE
    finally:
        backend.close()


def test_subsystems_without_inputs_are_absent_and_a_disabled_collector_hides_health() -> None:
    clock = Clock()
    sim = SimNvml(gpus=1, clock=clock)
    backend = NvmlBackend(Config(disabled_collectors=frozenset({"pcie", "xid"})), nvml=sim, clock=clock)
    backend.open()
    try:
        assert set(health(backend.read()[0])) == {"memory", "thermal", "power"}
    finally:
        backend.close()
    backend = NvmlBackend(Config(disabled_collectors=frozenset({"health"})), nvml=SimNvml(gpus=1), xid_wait_ms=20)
    backend.open()
    try:
        assert health(backend.read()[0]) == {}
    finally:
        backend.close()


def test_pcie_replay_rate_above_the_threshold_warns() -> None:
    tracker = HealthTracker()
    assert tracker.evaluate("a", {("pcie_replay", ()): 100.0}, 0.0)[("health", ("pcie",))] == OK
    slow = tracker.evaluate("a", {("pcie_replay", ()): 105.0}, 60.0)  # 5 a minute: a noisy link, fine
    assert slow[("health", ("pcie",))] == OK
    fast = tracker.evaluate("a", {("pcie_replay", ()): 125.0}, 120.0)  # 20 a minute
    assert fast[("health", ("pcie",))] == WARNING


@pytest.mark.parametrize(
    ("values", "level"),
    [
        ({("ecc_uncorrected_volatile", ()): 1.0}, FAILURE),
        ({("retired_pages_dbe", ()): 2.0, ("retired_pages_sbe", ()): 1.0}, WARNING),
        ({("retired_pages_dbe", ()): 30.0, ("retired_pages_sbe", ()): 30.0}, FAILURE),
        ({("ecc_uncorrected_volatile", ()): 0.0, ("remapped_rows_failure", ()): 0.0}, OK),
    ],
)
def test_memory_rules(values: dict[tuple[str, tuple[str, ...]], float], level: float) -> None:
    assert HealthTracker().evaluate("a", values, 0.0)[("health", ("memory",))] == level


def test_amd_health_from_ecc_and_throttle_time() -> None:
    clock = Clock()
    card = mi300x()
    fake = FakeAmdSmi([card])
    backend = amd.AmdBackend(Config(gpu_vendor="amd"), smi=fake, clock=clock)
    backend.open()
    assert health(backend.read()[0]) == {"memory": OK, "pcie": OK, "thermal": OK, "power": OK}
    fake.cards[0].ecc_total = {"correctable_count": 12, "uncorrectable_count": 1, "deferred_count": 0}
    fake.cards[0].violation = violation_status(1_006_000, 20_000 + 3_600, 0)  # power-held 60 % of 60 s
    clock.now += 60.0
    assert health(backend.read()[0]) == {"memory": FAILURE, "pcie": OK, "thermal": OK, "power": WARNING}
