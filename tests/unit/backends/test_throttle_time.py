"""Throttle time per cause: counters that rise at the simulated rate, in our units and in DCGM's."""

from __future__ import annotations

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.backends.amd import backend as amd
from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.exposition import render
from gpu_exporter.model import DeviceSample, Sample
from gpu_exporter.naming import dcgm_view
from tests.fakes.fake_amdsmi import FakeAmdSmi, mi210, mi300x, violation_status

POWER, THERMAL = pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _seconds(sample: DeviceSample, reason: str) -> float:
    return sample.values[(f"clock_event_seconds_{reason}", ())]


def _nvml(throttle: dict[int, float]) -> tuple[SimNvml, NvmlBackend, Clock]:
    clock = Clock()
    sim = SimNvml(gpus=2, clock=clock, throttle=throttle)
    backend = NvmlBackend(Config(disabled_collectors=frozenset({"xid"})), nvml=sim, clock=clock)
    backend.open()
    return sim, backend, clock


def test_counters_rise_at_the_simulated_rate() -> None:
    sim, backend, clock = _nvml({POWER: 0.25, THERMAL: 0.1})
    try:
        before = backend.read()
        clock.now += 40.0
        after = backend.read()
        for b, a in zip(before, after, strict=True):
            assert _seconds(a, "power") - _seconds(b, "power") == pytest.approx(40.0 * 0.25)
            assert _seconds(a, "thermal") - _seconds(b, "thermal") == pytest.approx(40.0 * 0.1)
            # the policies the simulated driver does not report are absent, not 0
            assert ("clock_event_seconds_sync_boost", ()) not in a.values
        sim.set_throttle(THERMAL, 0.5)  # a heat wave: the rate changes, the counter never goes back
        clock.now += 10.0
        hot = backend.read()
        assert _seconds(hot[0], "thermal") - _seconds(after[0], "thermal") == pytest.approx(10.0 * 0.5)
    finally:
        backend.close()


def test_dcgm_view_serves_violation_counters_in_microseconds() -> None:
    _, backend, clock = _nvml({POWER: 0.25, THERMAL: 0.1})
    try:
        backend.read()
        clock.now += 8.0
        devices = tuple(backend.read())
    finally:
        backend.close()
    page = render(Sample(1, clock.now, devices), dcgm_view("edge-1"))
    families = {f.name: f for f in text_string_to_metric_families(page)}
    power = families["DCGM_FI_DEV_POWER_VIOLATION"]
    assert power.type == "counter"
    assert "(in us)" in power.documentation
    gpu0 = next(s for s in power.samples if s.labels["gpu"] == "0")
    assert gpu0.value == pytest.approx(_seconds(devices[0], "power") * 1e6)
    assert gpu0.value == pytest.approx(8.0 * 0.25 * 1e6)
    assert "DCGM_FI_DEV_THERMAL_VIOLATION" in families
    assert "DCGM_FI_DEV_SYNC_BOOST_VIOLATION" not in families  # not reported by this driver


def test_amd_throttle_time_from_the_firmware_sample_counts() -> None:
    clock = Clock(1000.0)
    fake = FakeAmdSmi([mi300x(), mi210()])
    backend = amd.AmdBackend(Config(gpu_vendor="amd"), smi=fake, clock=clock)
    backend.open()
    first = backend.read()
    assert _seconds(first[0], "power") == 0.0  # counted from the agent's start
    assert ("clock_event_seconds_power", ()) not in first[1].values  # MI210: no violation status
    # 30 s later: 3000 new firmware samples, 750 of them power-limited, 300 thermally
    fake.cards[0].violation = violation_status(1_003_000, 20_750, 300)
    clock.now += 30.0
    second = backend.read()
    assert _seconds(second[0], "power") == pytest.approx(30.0 * 750 / 3000)
    assert _seconds(second[0], "thermal") == pytest.approx(30.0 * 300 / 3000)
    # the counters restart (driver reload): nothing is added, nothing goes back
    fake.cards[0].violation = violation_status(10, 10, 0)
    clock.now += 30.0
    third = backend.read()
    assert _seconds(third[0], "power") == pytest.approx(_seconds(second[0], "power"))
