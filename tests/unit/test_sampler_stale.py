"""A sampler that stops producing readings shows it: /readyz 503 and a page without GPU series once no
backend has read for 3 intervals (10 s at least). The monotonic clock is the test's, so "stale" is a
matter of the clock, not of the machine's speed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpu_exporter.cli import readiness
from gpu_exporter.exposition import AgentCollector, Exposition, native_view
from gpu_exporter.model import DeviceSample
from gpu_exporter.ring import RingBuffer
from gpu_exporter.sampler import Sampler
from tests.unit.test_ring_sampler import SlowBackend


def agent(interval: float, fail_on: set[int]) -> tuple[list[float], Sampler, Exposition, RingBuffer]:
    clock = [0.0]
    backend = SlowBackend(clock, cost=0.0, fail_on=fail_on)
    ring = RingBuffer(16)
    registry = CollectorRegistry(auto_describe=False)
    exposition = Exposition(registry, native_view())
    sampler = Sampler([backend], ring, interval, [exposition.update], monotonic=lambda: clock[0], wall=lambda: 5.0)
    exposition.stale = sampler.stale
    registry.register(AgentCollector(sampler, ring, [backend]))
    return clock, sampler, exposition, ring


def ready(sampler: Sampler, exposition: Exposition, ring: RingBuffer) -> tuple[bool, str]:
    return readiness(ring, exposition, sampler.backends, None, sampler)


def test_a_sampler_that_stops_makes_readiness_fail_and_the_page_drop_its_gpu_series() -> None:
    clock, sampler, exposition, ring = agent(1.0, fail_on=set())
    sampler.collect_once()
    assert ready(sampler, exposition, ring) == (True, "ready")
    assert b"gpu_power_watts" in exposition.page(False)
    clock[0] += 10.0  # no cycle since: a read stuck in a vendor call; 10 s is the floor, not yet stale
    assert ready(sampler, exposition, ring)[0]
    clock[0] += 0.5
    ok, why = ready(sampler, exposition, ring)
    assert not ok and "stuck or failing" in why
    page = exposition.page(False).decode()
    assert "gpu_power_watts" not in page and "gpu_up" not in page
    assert "gpu_exporter_sampler_stale 1.0" in page
    assert "gpu_power_watts" not in exposition.openmetrics_page(False).decode()
    sampler.collect_once()  # the read returned
    assert ready(sampler, exposition, ring) == (True, "ready")
    page = exposition.page(False).decode()
    assert "gpu_power_watts" in page and "gpu_exporter_sampler_stale 0.0" in page


def test_stale_after_three_intervals_when_that_is_longer_than_ten_seconds() -> None:
    clock, sampler, exposition, ring = agent(5.0, fail_on=set())
    sampler.collect_once()
    clock[0] += 15.0
    assert ready(sampler, exposition, ring)[0]
    clock[0] += 0.5
    assert not ready(sampler, exposition, ring)[0]


def test_a_sampler_whose_every_read_fails_is_stale_too() -> None:
    clock, sampler, exposition, ring = agent(1.0, fail_on=set(range(2, 100)))
    sampler.collect_once()
    for _ in range(11):  # cycles go on, each read raising
        clock[0] += 1.0
        sampler.collect_once()
    assert not ready(sampler, exposition, ring)[0]
    assert "gpu_exporter_sampler_stale 1.0" in exposition.page(False).decode()


def test_a_first_cycle_that_never_ends_is_stale_too() -> None:
    clock, sampler, exposition, ring = agent(1.0, fail_on=set())
    seen: list[tuple[bool, bytes]] = []

    def hangs() -> list[DeviceSample]:  # a probe and a scrape 11 s into the first read, still running
        clock[0] += 11.0
        seen.append((ready(sampler, exposition, ring)[0], exposition.page(False)))
        return []

    sampler.backends[0].read = hangs  # type: ignore[method-assign]
    sampler.collect_once()
    [(was_ready, page)] = seen
    assert not was_ready
    assert b"gpu_exporter_sampler_stale 1.0" in page
