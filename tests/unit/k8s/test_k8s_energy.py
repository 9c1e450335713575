"""Kepler-style per-pod energy on numbers worked by hand."""

from __future__ import annotations

import pytest

from gpu_exporter.k8s.energy import EnergyMeter


def test_active_power_split_by_sm_share_with_configured_idle() -> None:
    meter = EnergyMeter(idle_power=50.0)
    meter.step("gpu0", 0.0, 150.0, None, {"a": 0.6, "b": 0.2})  # first sample: nothing to integrate
    assert meter.total("gpu0", "a") == 0.0
    # 0 -> 2 s at 250 W: 500 J used, 2 x 50 = 100 J idle, 400 J active; a:b = 0.6:0.2 = 3:1
    meter.step("gpu0", 2.0, 250.0, None, {"a": 0.6, "b": 0.2})
    assert meter.total("gpu0", "a") == pytest.approx(300.0)
    assert meter.total("gpu0", "b") == pytest.approx(100.0)
    # 2 -> 4 s at 90 W, only a computing: 180 - 100 = 80 J, all to a
    meter.step("gpu0", 4.0, 90.0, None, {"a": 0.5, "b": 0.0})
    assert meter.total("gpu0", "a") == pytest.approx(380.0)
    assert meter.total("gpu0", "b") == pytest.approx(100.0)
    # 4 -> 5 s at 40 W: below idle, nothing active
    meter.step("gpu0", 5.0, 40.0, None, {"a": 0.9})
    assert meter.total("gpu0", "a") == pytest.approx(380.0)


def test_energy_counter_preferred_over_power_times_time() -> None:
    meter = EnergyMeter(idle_power=30.0)
    meter.step("gpu0", 100.0, 200.0, 10_000.0, {"a": 1.0})
    # the counter says 1 500 J in 5 s (power reads 200 W, which would give 1 000 J):
    # active = 1 500 - 5 x 30 = 1 350 J; a:b = 0.25:0.5 -> 450 J and 900 J
    meter.step("gpu0", 105.0, 200.0, 11_500.0, {"a": 0.25, "b": 0.5})
    assert meter.total("gpu0", "a") == pytest.approx(450.0)
    assert meter.total("gpu0", "b") == pytest.approx(900.0)
    # a counter that went backwards (driver reload) falls back to power x time: 3 x 100 - 90 = 210 J
    meter.step("gpu0", 108.0, 100.0, 20.0, {"b": 1.0})
    assert meter.total("gpu0", "b") == pytest.approx(1110.0)


def test_idle_power_defaults_to_the_lowest_power_seen() -> None:
    meter = EnergyMeter()
    meter.step("gpu0", 0.0, 80.0, None, {})
    assert meter.idle("gpu0") == 80.0
    # 0 -> 1 s at 200 W, idle 80: 120 J active, all to a
    meter.step("gpu0", 1.0, 200.0, None, {"a": 0.7})
    assert meter.total("gpu0", "a") == pytest.approx(120.0)
    # 1 -> 2 s at 60 W: the new minimum is 60, and 60 - 60 = 0 J active
    meter.step("gpu0", 2.0, 60.0, None, {"a": 0.7})
    assert meter.idle("gpu0") == 60.0
    assert meter.total("gpu0", "a") == pytest.approx(120.0)
    # 2 -> 4 s at 100 W: (100 - 60) x 2 = 80 J
    meter.step("gpu0", 4.0, 100.0, None, {"a": 0.7})
    assert meter.total("gpu0", "a") == pytest.approx(200.0)


def test_gpus_are_accounted_separately() -> None:
    meter = EnergyMeter(idle_power=10.0)
    for gpu, power in (("gpu0", 110.0), ("gpu1", 60.0)):
        meter.step(gpu, 0.0, power, None, {"a": 1.0})
        meter.step(gpu, 1.0, power, None, {"a": 1.0})
    assert meter.total("gpu0", "a") == pytest.approx(100.0)
    assert meter.total("gpu1", "a") == pytest.approx(50.0)


def test_long_gaps_and_zero_utilization_attribute_nothing() -> None:
    meter = EnergyMeter(idle_power=10.0, max_gap=60.0)
    meter.step("gpu0", 0.0, 100.0, None, {"a": 1.0})
    meter.step("gpu0", 600.0, 100.0, None, {"a": 1.0})  # agent paused 10 minutes: not integrated
    assert meter.total("gpu0", "a") == 0.0
    meter.step("gpu0", 601.0, 100.0, None, {"a": 0.0, "b": 0.0})  # nobody computing
    assert meter.total("gpu0", "a") == 0.0 and meter.total("gpu0", "b") == 0.0
    meter.step("gpu0", 602.0, 100.0, None, {"a": 1.0})  # resumes from 601
    assert meter.total("gpu0", "a") == pytest.approx(90.0)


def test_retain_forgets_finished_pods() -> None:
    meter = EnergyMeter(idle_power=0.0)
    meter.step("gpu0", 0.0, 100.0, None, {"a": 1.0, "b": 1.0})
    meter.step("gpu0", 1.0, 100.0, None, {"a": 1.0, "b": 1.0})
    meter.retain([("gpu0", "a")])
    assert meter.total("gpu0", "a") == pytest.approx(50.0)
    assert meter.total("gpu0", "b") == 0.0


def test_negative_idle_power_is_refused() -> None:
    with pytest.raises(ValueError, match="idle power"):
        EnergyMeter(idle_power=-1.0)
