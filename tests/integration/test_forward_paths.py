"""Forwarder paths where data is at stake, against a real Mosquitto: a broker that refuses a batch, samples
the ring overwrote, a journal with a corrupt entry, the replay rate, and a batch closed by its sample
count or by its estimated size."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.forward.service import Forwarder
from gpu_exporter.forward.spool import Spool
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, encode
from gpu_exporter.ring import RingBuffer
from tests.integration.test_forward_service import make_config, metric, start_forwarder
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)

pytestmark = pytest.mark.integration

DEVICES = (DeviceId("0", "GPU-0000"), DeviceId("1", "GPU-1111"))


def sample(seq: int) -> Sample:
    devs = tuple(
        DeviceSample(
            d,
            True,
            {("utilization", ()): (seq * 7 + i) % 101 / 100, ("memory_used", ()): float(2**30 + seq * 4096)},
            {"name": "sim"},
        )
        for i, d in enumerate(DEVICES)
    )
    return Sample(seq, 1_700_000_000.0 + seq, devs)


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Any]:
    """A forwarder factory; every forwarder started is stopped at the end."""
    started: list[Forwarder] = []

    def start(
        broker: Broker, ring: RingBuffer, clock: Any = time.monotonic, **overrides: str
    ) -> tuple[Forwarder, CollectorRegistry]:
        return start_forwarder(started, make_config(tmp_path, broker, **overrides), ring, clock)

    yield start
    for fwd in started:
        fwd.stop(5)


def feed_one_by_one(fwd: Forwarder, ring: RingBuffer, seqs: range) -> None:
    """Append samples as the sampler does, each once the forwarder took the one before (so that batches
    close exactly where their rule says, whatever the machine's load). Connected first: a connection
    made while a batch is open closes it at once (the newest data goes first)."""
    assert wait_until(lambda: fwd.link.up, 10), "the forwarder did not connect"
    for seq in seqs:
        ring.append(sample(seq))
        assert wait_until(lambda seq=seq: fwd._last_seq == seq, 10), f"sample {seq} was not taken"


def batch_seqs(sub: Collector) -> list[list[int]]:
    with sub._lock:
        return [[s.seq for s in b.samples] for b in sub.batches]


# ---------------------------------------------------------------------------------- refused by the broker


def _acl(path: Path, forwarder_may_publish: bool) -> None:
    lines = ["topic write gpu-exporter/+/status"]  # anonymous clients (the forwarder)
    if forwarder_may_publish:
        lines.append("topic write gpu-exporter/+/batch")
    lines += ["", "user collector", "topic read gpu-exporter/#"]
    path.write_text("\n".join(lines) + "\n")


def test_a_batch_the_broker_refuses_stays_spooled_and_arrives_once_allowed(tmp_path: Path, running: Any) -> None:
    acl = tmp_path / "acl"
    _acl(acl, forwarder_may_publish=False)
    broker = Broker(tmp_path / "mosquitto", extra=f"acl_file {acl}\n")
    broker.start()
    try:
        with Collector(broker, username="collector") as sub:
            ring = RingBuffer(64)
            fwd, registry = running(broker, ring)
            feed_one_by_one(fwd, ring, range(1, 9))
            # MQTT 5: the broker answers the denied PUBLISH with a PUBACK carrying "Not authorized".
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_publish_errors_total") >= 3, 15)
            assert metric(registry, "gpu_exporter_forward_published_batches_total") == 0
            assert sub.count() == 0
            assert wait_until(lambda: len(fwd.spool) >= 2, 10)  # refused batches are kept, not dropped

            _acl(acl, forwarder_may_publish=True)
            assert broker.proc is not None
            os.kill(broker.proc.pid, signal.SIGHUP)  # Mosquitto re-reads its ACL file
            feed_one_by_one(fwd, ring, range(9, 13))
            assert wait_until(lambda: sub.seqs(fwd.boot).get(fwd.boot, set()) >= set(range(1, 12)), 20), sub.seqs()
            assert not [s for s in sub.seqs(fwd.boot)[fwd.boot] if s not in range(1, 13)]
            assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="max_bytes") == 0
    finally:
        broker.stop()


# ---------------------------------------------------------------------------------- missed samples


def test_samples_the_ring_overwrote_are_counted_as_missed(broker: Broker, running: Any) -> None:
    ring = RingBuffer(4)
    for seq in range(1, 21):
        ring.append(sample(seq))  # before the forwarder runs: only 17..20 are still in the ring
    with Collector(broker) as sub:
        fwd, registry = running(broker, ring)
        assert wait_until(lambda: sub.seqs(fwd.boot).get(fwd.boot) == {17, 18, 19, 20}, 15), sub.seqs()
        assert metric(registry, "gpu_exporter_forward_missed_samples_total") == 16


# ---------------------------------------------------------------------------------- journal recovery


def test_journal_recovery_sends_the_good_entries_and_counts_the_corrupt_one(
    tmp_path: Path, broker: Broker, running: Any
) -> None:
    # A previous run journaled samples 1..6 of its open batch and was killed; entry 4 is damaged.
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 86400)
    spool.open()
    for seq in range(1, 7):
        data = encode(Batch("node-a", "previous", (sample(seq),)), level=1)
        assert spool.journal("previous", seq, data[: len(data) // 2] if seq == 4 else data) is not None
    spool.close()

    with Collector(broker) as sub:
        fwd, registry = running(broker, RingBuffer(8))
        assert wait_until(lambda: sub.seqs("previous").get("previous") == {1, 2, 3, 5, 6}, 15), sub.seqs()
        assert wait_until(lambda: len(fwd.spool) == 0, 10)
        assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="corrupt") == 1
        fwd.stop(5)

    again = Spool(str(tmp_path / "spool"), 1 << 30, 86400)
    assert again.open() == []  # the corrupt entry is gone too: the next start does not count it again
    again.close()


# ---------------------------------------------------------------------------------- replay rate


def test_the_backlog_is_replayed_at_the_replay_rate(tmp_path: Path, broker: Broker, running: Any) -> None:
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 86400)
    spool.open()
    for seq in range(1, 11):  # ten batches left by an outage
        spool.put(encode(Batch("node-a", "outage", (sample(seq),))), seq, seq, 1)
    spool.close()

    clock = Clock()  # stands still unless the test moves it: the rate's tokens refill only then
    with Collector(broker) as sub:
        _fwd, registry = running(broker, RingBuffer(8), clock=clock, **{"spool.replay-rate": "3"})

        def arrived() -> list[int]:
            return sorted(sub.seqs("outage").get("outage", set()))

        # On connect: the newest batch at once (it is fresh as far as anyone knows), then one token's worth.
        assert wait_until(lambda: len(arrived()) >= 2, 15)
        time.sleep(0.5)  # many forwarder turns, no time passing on its clock
        assert arrived() == [1, 10]
        clock.now += 1.0  # 3 tokens
        assert wait_until(lambda: len(arrived()) >= 5, 10)
        time.sleep(0.5)
        assert arrived() == [1, 2, 3, 4, 10]
        clock.now += 100.0  # a long pause refills at most max(1, rate) tokens: no burst of 300
        assert wait_until(lambda: len(arrived()) >= 8, 10)
        time.sleep(0.5)
        assert arrived() == [1, 2, 3, 4, 5, 6, 7, 10]
        clock.now += 1.0
        assert wait_until(lambda: arrived() == list(range(1, 11)), 10)
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_published_batches_total") == 10, 10)


# ---------------------------------------------------------------------------------- when a batch closes


def test_a_batch_closes_at_its_sample_count(broker: Broker, running: Any) -> None:
    ring = RingBuffer(64)
    with Collector(broker) as sub:
        fwd, _ = running(broker, ring, **{"mqtt.batch-interval": "1h", "mqtt.batch-max-samples": "5"})
        feed_one_by_one(fwd, ring, range(1, 13))
        assert wait_until(lambda: len(batch_seqs(sub)) >= 2, 15)
        time.sleep(0.3)
        assert batch_seqs(sub) == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]  # 11 and 12 wait for three more


def test_a_batch_closes_when_its_estimated_size_nears_the_byte_limit(broker: Broker, running: Any) -> None:
    ring = RingBuffer(256)
    limit = 4096
    with Collector(broker) as sub:
        fwd, _ = running(
            broker,
            ring,
            **{"mqtt.batch-interval": "1h", "mqtt.batch-max-samples": "100000", "mqtt.batch-max-bytes": str(limit)},
        )
        feed_one_by_one(fwd, ring, range(1, 121))
        assert wait_until(lambda: len(batch_seqs(sub)) >= 2, 15)  # long before the hour, by size alone
        with sub._lock:
            sizes = [len(raw) for raw in sub.raw]
        assert all(size <= limit for size in sizes), sizes
        seqs = [s for batch in batch_seqs(sub) for s in batch]
        assert seqs == list(range(1, len(seqs) + 1))  # in order, none twice, none skipped
