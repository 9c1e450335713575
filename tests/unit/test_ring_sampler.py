"""Ring buffer semantics and the sampler's schedule and fault tolerance."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.ring import RingBuffer
from gpu_exporter.sampler import Sampler


def s(seq: int) -> Sample:
    return Sample(seq, float(seq), ())


def test_ring_overwrites_oldest_and_counts() -> None:
    ring = RingBuffer(3)
    for i in range(1, 6):
        ring.append(s(i))
    assert len(ring) == 3 and ring.overwritten == 2
    assert [x.seq for x in ring.since(0)[0]] == [3, 4, 5]
    latest = ring.latest()
    assert latest is not None and latest.seq == 5


def test_reader_following_by_sequence_learns_what_it_missed() -> None:
    ring = RingBuffer(3)
    for i in range(1, 4):
        ring.append(s(i))
    got, missed = ring.since(1)
    assert [x.seq for x in got] == [2, 3] and missed == 0
    for i in range(4, 8):
        ring.append(s(i))
    got, missed = ring.since(3)
    assert [x.seq for x in got] == [5, 6, 7] and missed == 1  # seq 4 was overwritten before it was read
    assert ring.since(7) == ([], 0)
    assert [x.seq for x in ring.since(4, limit=2)[0]] == [5, 6]


def test_ring_rejects_non_increasing_sequence() -> None:
    ring = RingBuffer(2)
    ring.append(s(2))
    with pytest.raises(ValueError):
        ring.append(s(2))
    with pytest.raises(ValueError):
        RingBuffer(0)


def test_wait_after() -> None:
    ring = RingBuffer(2)
    assert not ring.wait_after(0, timeout=0.01)
    ring.append(s(1))
    assert ring.wait_after(0, timeout=0.01)
    assert not ring.wait_after(1, timeout=0.01)


class SlowBackend:
    """Advances a fake monotonic clock as if each read took ``cost`` seconds."""

    name = "slow"

    def __init__(self, clock: list[float], cost: float, fail_on: set[int] | None = None) -> None:
        self.clock = clock
        self.cost = cost
        self.reads = 0
        self.fail_on = fail_on or set()
        self.errors: Counter[str] = Counter()

    def open(self) -> None: ...

    def read(self) -> list[DeviceSample]:
        self.reads += 1
        self.clock[0] += self.cost
        if self.reads in self.fail_on:
            raise RuntimeError("vendor library bug")
        return [DeviceSample(DeviceId("0", "GPU-x"), True, {("power", ()): float(self.reads)})]

    def healthy(self) -> bool:
        return True

    def close(self) -> None: ...


def test_a_wait_for_the_next_sample_ends_when_its_interrupt_is_set_and_the_ring_woken() -> None:
    """The forwarder's quiet turn waits on the ring for the next sample; stopping it must not wait that out."""
    ring = RingBuffer(4)
    stop = threading.Event()
    answers: list[bool] = []
    waiter = threading.Thread(target=lambda: answers.append(ring.wait_after(0, 60.0, stop)))
    waiter.start()
    stop.set()
    ring.wake()
    waiter.join(10.0)
    assert not waiter.is_alive() and answers == [False]  # no sample came
    assert ring.wait_after(0, 60.0, stop) is False  # set already: no wait at all
    ring.append(Sample(1, 1.0, ()))
    assert ring.wait_after(0, 0.0, stop) is True


def test_overrunning_cycles_skip_ticks_instead_of_bunching() -> None:
    clock = [0.0]
    backend = SlowBackend(clock, cost=2.5)  # each read takes 2.5 intervals
    ring = RingBuffer(100)
    stop = [False]

    def wait(seconds: float) -> bool:
        clock[0] += seconds
        return stop[0]

    sampler = Sampler([backend], ring, 1.0, monotonic=lambda: clock[0], wall=lambda: 1e9 + clock[0], wait=wait)
    listener_seen: list[int] = []
    sampler.listeners.append(lambda sample: listener_seen.append(sample.seq))
    sampler.listeners.append(lambda sample: stop.__setitem__(0, sample.seq == 4))
    sampler.run()
    assert [x.seq for x in ring.since(0)[0]] == [1, 2, 3, 4]
    assert listener_seen == [1, 2, 3, 4]
    assert sampler.overruns == 8  # 2 skipped ticks per cycle
    assert sampler.last_duration == 2.5
    assert [x.timestamp - 1e9 for x in ring.since(0)[0]] == [0.0, 3.0, 6.0, 9.0]  # on the tick grid


def test_backend_exception_does_not_stop_sampling() -> None:
    clock = [0.0]
    backend = SlowBackend(clock, cost=0.0, fail_on={2})
    ring = RingBuffer(10)
    sampler = Sampler([backend], ring, 1.0, monotonic=lambda: clock[0], wall=lambda: 5.0)
    first, second, third = (sampler.collect_once() for _ in range(3))
    assert len(first.devices) == 1 and second.devices == () and len(third.devices) == 1
    assert sampler.failures == 1
    assert [x.seq for x in ring.since(0)[0]] == [1, 2, 3]


def test_a_failing_listener_is_contained() -> None:
    clock = [0.0]
    ring = RingBuffer(10)

    def broken(sample: Sample) -> None:
        raise ValueError("bad listener")

    sampler = Sampler([SlowBackend(clock, 0.0)], ring, 1.0, [broken])
    sampler.collect_once()
    assert len(ring) == 1
