"""The forwarder in-process against a real Mosquitto: every sample arrives, or its loss is counted."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter import catalog
from gpu_exporter import config as cfg
from gpu_exporter.forward.prepare import EVENT_KEYS, has_event
from gpu_exporter.forward.service import Forwarder
from gpu_exporter.forward.spool import Spool
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, encode
from gpu_exporter.ring import RingBuffer
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)

pytestmark = pytest.mark.integration

DEVICES = (DeviceId("0", "GPU-0000"), DeviceId("1", "GPU-1111"))


def make_sample(seq: int, noisy: bool = False) -> Sample:
    """NVML-like readings; ``noisy`` adds full-precision random values that compress poorly."""
    devs = tuple(
        DeviceSample(
            d,
            True,
            {
                ("utilization", ()): (seq * 7 + i) % 101 / 100,
                ("power", ()): 200 + (seq % 1000) / 1000,
                ("memory_used", ()): float(2**30 + seq * 4096),
                **(
                    {("pcie_tx", ()): float(random.getrandbits(48)), ("pcie_rx", ()): float(random.getrandbits(48))}
                    if noisy
                    else {}
                ),
            },
            {"name": "sim"},
        )
        for i, d in enumerate(DEVICES)
    )
    return Sample(seq, time.time(), devs)


class Feeder:
    """Appends a sample to the ring every ``interval`` seconds, like the sampler."""

    def __init__(self, ring: RingBuffer, interval: float = 0.02, noisy: bool = False) -> None:
        self.ring = ring
        self.noisy = noisy
        self.interval = interval
        self.seq = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.seq += 1
            self.ring.append(make_sample(self.seq, self.noisy))

    def __enter__(self) -> Feeder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def make_config(tmp_path: Path, broker: Broker, **overrides: str) -> cfg.Config:
    args = {
        "mqtt.url": broker.url,
        "node-name": "node-a",
        "spool.dir": str(tmp_path / "spool"),
        "mqtt.batch-interval": "200ms",
        "mqtt.reconnect-max-delay": "500ms",
        "spool.replay-rate": "200",
        **overrides,
    }
    return cfg.load(args, environ={})


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def start_forwarder(
    started: list[Forwarder], config: cfg.Config, ring: RingBuffer, clock: Any = time.monotonic
) -> tuple[Forwarder, CollectorRegistry]:
    """A started forwarder (ready) and its registry; ``started`` collects it for the fixture to stop."""
    registry = CollectorRegistry()
    fwd = Forwarder(config, ring, registry, clock=clock)
    fwd.start()
    started.append(fwd)
    assert fwd.ready.wait(10)
    return fwd, registry


@pytest.fixture
def running(tmp_path: Path, broker: Broker) -> Iterator[Any]:
    """A forwarder factory; every forwarder started is stopped at the end."""
    started: list[Forwarder] = []

    def start(ring: RingBuffer, **overrides: str) -> tuple[Forwarder, CollectorRegistry]:
        return start_forwarder(started, make_config(tmp_path, broker, **overrides), ring)

    yield start
    for fwd in started:
        fwd.stop(5)


def contiguous(seqs: set[int]) -> bool:
    return bool(seqs) and seqs == set(range(1, max(seqs) + 1))


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_every_sample_arrives_once_in_order_and_the_spool_empties(broker: Broker, running: Any, protocol: str) -> None:
    ring = RingBuffer(256)
    with Collector(broker) as sub:
        fwd, registry = running(ring, **{"mqtt.protocol": protocol})
        with Feeder(ring):
            assert wait_until(lambda: sub.count() >= 40, 20)
        last = ring.latest()
        assert last is not None
        assert wait_until(lambda: max(sub.seqs().get(fwd.boot, {0})) >= last.seq, 10)
        fwd.stop(5)
        assert wait_until(lambda: sub.status.get("gpu-exporter/node-a/status") == b"offline", 5)
        seqs = sub.seqs()[fwd.boot]
        assert seqs == set(range(1, last.seq + 1))
        assert sub.count() == last.seq  # no duplicates on a healthy link
        assert [b.node for b in sub.batches] == ["node-a"] * len(sub.batches)
        firsts = [o[1] for o in sub.order]
        assert firsts == sorted(firsts)
        assert metric(registry, "gpu_exporter_forward_published_samples_total") == last.seq
        assert metric(registry, "gpu_exporter_forward_spool_batches") == 0
        assert len(Spool(str(Path(fwd.config.spool_dir)), 1 << 30, 1e9).open()) == 0  # journal empty
        sample = sub.batches[0].samples[0]
        assert sample.devices[0].values[("memory_used", ())] == float(2**30 + sample.seq * 4096)


def test_broker_outage_spools_then_sends_newest_first_and_loses_nothing(broker: Broker, running: Any) -> None:
    ring = RingBuffer(1024)
    with Collector(broker) as sub:
        fwd, registry = running(ring, **{"spool.replay-rate": "5"})
        with Feeder(ring):
            assert wait_until(lambda: sub.count() >= 10, 10)
            broker.stop()
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_connected") == 0, 5)
            time.sleep(4)  # samples keep coming; batches pile up in the spool
            spooled = metric(registry, "gpu_exporter_forward_spool_batches")
            assert spooled >= 4
            assert metric(registry, "gpu_exporter_forward_spool_oldest_age_seconds") > 1
            arrived_before = len(sub.order)
            broker.start()
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_connected") == 1, 10)
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") == 0, 20)
        last = ring.latest()
        assert last is not None
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_published_samples_total") >= last.seq, 10)
        assert wait_until(lambda: sub.caught_up(fwd.boot, last.seq), 10)
        assert contiguous(sub.seqs()[fwd.boot])
        after = sub.order[arrived_before:]
        # The first batch after the outage is the newest of the spooled data; the backlog follows.
        first_after = after[0]
        backlog = [o for o in after[1:] if o[2] < first_after[1]]
        assert len(backlog) >= 3
        assert [o[1] for o in backlog] == sorted(o[1] for o in backlog)  # oldest first behind it
        # While the broker was away, batches grew: fewer, larger messages than on a healthy link.
        sizes = [o[2] - o[1] + 1 for o in after]
        healthy = [o[2] - o[1] + 1 for o in sub.order[:arrived_before]]
        assert max(sizes) > 2 * max(healthy)
        assert metric(registry, "gpu_exporter_forward_connect_errors_total", kind="lost") >= 1


@pytest.mark.timeout(360)  # the feeding below is bounded by samples fed, not by time
def test_spool_cap_drops_oldest_batches_and_counts_every_lost_sample(
    tmp_path: Path, broker: Broker, running: Any
) -> None:
    ring = RingBuffer(4096)
    # The subscriber comes back after the exporter (as a bridge may): the broker holds the batches in its
    # persistent session and sends them late, the newest first.
    with Collector(broker, reconnect_delay=(2.0, 2.0)) as sub:
        broker.stop()
        fwd, registry = running(ring, **{"spool.max-bytes": "64KiB", "mqtt.batch-interval": "50ms"})
        with Feeder(ring, interval=0.005, noisy=True) as feeder:
            # bounded by what was fed, not by the clock (a loaded machine feeds slower): 64 KiB hold about
            # 2,000 noisy samples, so 8,000 fed without three batches dropped is a failure
            def dropped() -> float:
                return metric(registry, "gpu_exporter_forward_dropped_batches_total", reason="max_bytes")

            wait_until(lambda: dropped() >= 3 or feeder.seq >= 8000, 240)
            assert dropped() >= 3, f"{feeder.seq} samples fed"
        assert metric(registry, "gpu_exporter_forward_spool_bytes") <= 64 * 1024
        broker.start()
        last = ring.latest()
        assert last is not None
        assert wait_until(lambda: max(sub.seqs().get(fwd.boot, {0})) >= last.seq, 30)  # the newest goes first
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") == 0, 30)
        published = metric(registry, "gpu_exporter_forward_published_samples_total")
        assert wait_until(lambda: sub.caught_up(fwd.boot, published), 15)
        got = sub.seqs()[fwd.boot]
        assert len(got) == published  # every sample the broker acknowledged arrived, once
        lost = set(range(1, last.seq + 1)) - got
        assert lost, "the cap was reached, something must have been dropped"
        assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="max_bytes") == len(lost)
        assert min(lost) == 1  # the oldest went first
        assert max(lost) < min(got - set(range(1, min(lost))))  # ... and only the oldest


def test_a_corrupt_spool_entry_is_moved_aside_and_counted(tmp_path: Path, broker: Broker, running: Any) -> None:
    spool_dir = tmp_path / "spool"
    old = Spool(str(spool_dir), 1 << 30, 1e9)
    old.open()
    old_boot = "0ldb00t"
    good = encode(Batch("node-a", old_boot, (make_sample(1), make_sample(2))))
    old.put(good, 1, 2, 2)
    old.put(b"\x1f\x8b not gzip at all", 3, 4, 2)
    old.put(encode(Batch("node-a", old_boot, (make_sample(5),))), 5, 5, 1)
    old.close()
    ring = RingBuffer(64)
    with Collector(broker) as sub:
        _, registry = running(ring)
        assert wait_until(lambda: old_boot in sub.seqs() and len(sub.seqs()[old_boot]) == 3, 10)
        assert sub.seqs()[old_boot] == {1, 2, 5}
        assert wait_until(
            lambda: metric(registry, "gpu_exporter_forward_dropped_batches_total", reason="corrupt") == 1, 5
        )
        assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="corrupt") == 2
        aside = list((spool_dir / "corrupt").iterdir())
        assert len(aside) == 1 and aside[0].read_bytes() == b"\x1f\x8b not gzip at all"
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") == 0, 5)


def test_samples_of_a_killed_run_are_recovered_from_the_journal(tmp_path: Path, broker: Broker, running: Any) -> None:
    spool_dir = tmp_path / "spool"
    killed = Spool(str(spool_dir), 1 << 30, 1e9)
    killed.open()
    for seq in (1, 2, 3):
        killed.journal("deadb00t", seq, encode(Batch("node-a", "deadb00t", (make_sample(seq),))))
    killed.close()  # what a SIGKILL leaves: journaled samples, no batch
    with Collector(broker) as sub:
        running(RingBuffer(64))
        assert wait_until(lambda: sub.seqs().get("deadb00t") == {1, 2, 3}, 10)
    after = Spool(str(spool_dir), 1 << 30, 1e9)
    assert after.open() == []
    assert Entry.parse("q.000000000001.1.2.3.4.5") == Entry(1, 1, 2, 3, 4, 5)


@pytest.mark.parametrize("digits", [None, "6", "0"])
def test_fractional_gauges_travel_with_the_configured_digits_and_counters_exactly(
    broker: Broker, running: Any, digits: str | None
) -> None:
    ring = RingBuffer(16)
    dev = DeviceId("0", "GPU-0000")
    values = {
        ("sm_active", ()): 0.27080922905007754,
        ("power", ()): 496.47200000000004,
        ("energy", ()): 12345.6789012345,
    }
    ring.append(Sample(1, time.time(), (DeviceSample(dev, True, dict(values)),)))
    with Collector(broker) as sub:
        running(ring, **({"mqtt.value-digits": digits} if digits else {}))
        assert wait_until(lambda: sub.count() == 1, 10)
    got = sub.batches[0].samples[0].devices[0].values
    if digits == "0":
        assert got == values
    elif digits is None:  # the default: 4 significant digits
        assert got[("sm_active", ())] == 0.2708
        assert got[("power", ())] == 496.5
        assert got[("energy", ())] == 12345.6789012345
    else:
        assert got[("sm_active", ())] == 0.270809
        assert got[("power", ())] == 496.472
        assert got[("energy", ())] == 12345.6789012345  # a counter: never rounded


def test_an_unusable_spool_directory_still_forwards_from_memory(tmp_path: Path, broker: Broker) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    registry = CollectorRegistry()
    config = make_config(tmp_path, broker, **{"spool.dir": str(blocker / "spool")})
    ring = RingBuffer(64)
    fwd = Forwarder(config, ring, registry)
    with Collector(broker) as sub:
        fwd.start()
        try:
            for seq in range(1, 6):
                ring.append(make_sample(seq))
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == {1, 2, 3, 4, 5}, 10)
            assert metric(registry, "gpu_exporter_forward_spool_write_errors_total") >= 1
        finally:
            fwd.stop(5)


def _event_sample(seq: int, up: bool = True, xid79: float = 0.0) -> Sample:
    devs = tuple(
        DeviceSample(
            d,
            up if i == 1 else True,
            {("power", ()): 200.0 + seq, ("xid_errors", ("79",)): xid79 if i == 1 else 0.0} if up or i == 0 else {},
        )
        for i, d in enumerate(DEVICES)
    )
    return Sample(seq, time.time(), devs)


def test_a_gpu_event_closes_the_batch_at_once_not_at_the_end_of_the_interval(broker: Broker, running: Any) -> None:
    ring = RingBuffer(64)
    with Collector(broker) as sub:
        fwd, _ = running(ring, **{"mqtt.batch-interval": "60s"})
        for seq in range(1, 4):
            ring.append(_event_sample(seq))  # routine readings: they wait for the interval
        time.sleep(1.0)
        assert sub.count() == 0
        ring.append(_event_sample(4, xid79=1.0))  # XID 79 on GPU 1: an alert waits for this
        assert wait_until(lambda: sub.count() == 4, 5)
        assert sub.batches[0].samples[-1].devices[1].values[("xid_errors", ("79",))] == 1.0
        # at most one early close per interval: a flapping GPU cannot turn batching off
        ring.append(_event_sample(5, up=False))
        time.sleep(1.0)
        assert sub.count() == 4
        fwd.stop(5)
        assert wait_until(lambda: sub.seqs().get(fwd.boot) == {1, 2, 3, 4, 5}, 5)  # and nothing is lost


def test_what_counts_as_an_event() -> None:
    base = _event_sample(1)
    assert not has_event(base, _event_sample(2))  # power changed: routine
    assert has_event(base, _event_sample(2, xid79=1.0))
    assert has_event(base, _event_sample(2, up=False))
    assert has_event(_event_sample(1, up=False), _event_sample(2))  # back again
    fewer = Sample(2, time.time(), base.devices[:1])
    assert has_event(base, fewer) and has_event(fewer, base)  # a GPU gone, or a new one
    ecc = Sample(
        2, time.time(), (base.devices[0], DeviceSample(DEVICES[1], True, {("ecc_uncorrected_volatile", ()): 1.0}))
    )
    assert has_event(Sample(1, 0.0, (base.devices[0], DeviceSample(DEVICES[1], True, {}))), ecc)
    assert {m.key for m in catalog.CATALOG} >= EVENT_KEYS


def test_a_batch_over_the_size_cap_is_split_and_each_half_takes_its_own_journal(
    tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring = RingBuffer(64)
    config = make_config(tmp_path, broker, **{"mqtt.batch-max-bytes": "1KiB", "mqtt.batch-interval": "1h"})
    registry = CollectorRegistry()
    fwd = Forwarder(config, ring, registry)  # not started: driven by hand, the broker never asked
    fwd.spool.open()
    for seq in range(1, 49):
        ring.append(make_sample(seq, noisy=True))
    fwd._take()  # every sample journaled on disk
    writes = []
    real_write = fwd.spool._write

    def disk_full_after_the_first_half(key: str, data: bytes, journal: Any) -> BaseException | None:
        writes.append(list(journal))
        return OSError(28, "No space left on device") if len(writes) > 1 else real_write(key, data, journal)

    monkeypatch.setattr(fwd.spool, "_write", disk_full_after_the_first_half)
    fwd._close_batch()
    entries = list(fwd.spool.entries())
    assert len(entries) >= 2  # 48 noisy samples (random 48-bit PCIe figures) do not fit in 1 KiB
    covered = [seq for e in entries for seq in range(e.first_seq, e.last_seq + 1)]
    assert covered == list(range(1, 49))
    stored = entries[0]  # the first half reached the disk and took its own samples' journal with it
    assert [int(k.rsplit(".", 1)[1]) for k in writes[0]] == list(range(stored.first_seq, stored.last_seq + 1))
    fwd.spool.close()  # the rest stayed in memory: its samples are journaled, so nothing is lost
    assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="disk_full") == 0
    again = Spool(config.spool_dir, 1 << 30, 1e9)
    journal = again.open()
    assert [(e.first_seq, e.last_seq) for e in again.entries()] == [(stored.first_seq, stored.last_seq)]
    # the next start folds exactly the samples that were not in the stored half back into batches
    assert sorted(int(k.rsplit(".", 1)[1]) for k, _ in journal) == list(range(stored.last_seq + 1, 49))
    again.close()
