"""What full resolution needs, and when the link is judged again (docs/forwarding.md, "Weak links"): a
batch closed by its sample count is timed over what its samples cover, and a batch interval without a
sample judges the link again, so that summarising ends when a burst ends or the link recovers, without
waiting for another sample."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter import config as cfg
from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.service import Forwarder
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.ring import RingBuffer
from tests.support.mosquitto import wait_until
from tests.support.ports import free_port

T0 = 1e9


def _sample(seq: int, every: float = 0.5) -> Sample:
    values = {("temp_gpu", ()): 60.0 + seq % 7, ("power", ()): 200.0 + seq % 5, ("energy", ()): 100.0 * seq}
    return Sample(seq, T0 + every * seq, (DeviceSample(DeviceId("0", "GPU-0"), True, values, {}),))


def _need(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("gpu_exporter_forward_full_resolution_bytes_per_second") or 0.0


def test_batches_closed_by_their_sample_count_are_timed_over_the_time_their_samples_cover(tmp_path: Path) -> None:
    """--mqtt.batch-max-samples=1: each batch closes in the turn its sample came. A sample every 0.5 s
    takes its size over 0.5 s; timed from when the sample was taken, a batch of a few hundred bytes read
    as tens of kB/s, and a link with room to spare as too thin for full resolution (the forward-limits
    flake). The broker is away here: what a batch needs is measured all the same. The forwarder's clock is
    moved by hand, 0.5 s before each sample."""
    config = cfg.load(
        {
            "mqtt.url": f"mqtt://127.0.0.1:{free_port()}",  # nothing listens: batches stay in the spool
            "node-name": "node-a",
            "spool.dir": str(tmp_path / "spool"),
            "mqtt.batch-max-samples": "1",
            "mqtt.batch-interval": "10s",
        },
        environ={},
    )
    ring = RingBuffer(64)
    registry = CollectorRegistry()
    clock = [100.0]
    fwd = Forwarder(config, ring, registry, clock=lambda: clock[0])
    fwd.start()
    try:
        assert fwd.ready.wait(10)
        for seq in range(1, 13):
            clock[0] += 0.5
            ring.append(_sample(seq))  # one every 0.5 s
            wait_until(lambda seq=seq: len(fwd.spool) == seq, 10, f"batch {seq} spooled on its own")
        sizes = [e.size for e in fwd.spool.entries_view()]
    finally:
        fwd.stop(5)
    takes = sum(sizes[-8:]) / (8 * 0.5)  # the latest 8 batches, 0.5 s each
    assert _need(registry) == pytest.approx(takes, rel=0.01)


def _measured(rate: float, registry: CollectorRegistry | None = None) -> LinkMeter:
    """A meter that measured ``rate`` bytes per second (one 1000-byte PUBLISH alone on the link)."""
    meter = LinkMeter(registry)
    meter.sent(1, 1000, 0.0)
    meter.acked(1, 1000 / rate, latency=0.0)
    return meter


def _burst(adaptive: Adaptive, batches: int, size: int, interval: float) -> None:
    for b in range(batches):
        samples = [_sample(b * 10 + s, every=interval / 10) for s in range(1, 11)]
        adaptive.closed(samples, [Entry(b + 1, 0, size, b * 10 + 1, b * 10 + 10, 10)], interval, connected=True)


def test_when_a_burst_is_over_batch_intervals_without_samples_end_summarising() -> None:
    """Full resolution needed 3 kB/s for a while on a 1 kB/s link: summaries first, rightly. Then no
    sample comes: nothing closes a batch, and before, the judgement made during the burst stood until
    the next sample: not one raw batch went, however idle the link."""
    registry = CollectorRegistry()
    meter = _measured(1000.0, registry)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=2.0)
    _burst(adaptive, 4, 6000, 2.0)
    assert adaptive.active and registry.get_sample_value("gpu_exporter_forward_summarizing") == 1
    assert not adaptive.raw_allowed(3000, 0.0, until_next=2.0)  # 3 s of the link: past the next summary
    adaptive.idle(2.0, connected=True)
    assert adaptive.active  # one quiet interval: the burst still weighs (4 x 6 kB over 10 s)
    quiet = 1
    while adaptive.active and quiet < 8:  # the need is over the latest 8 intervals
        adaptive.idle(2.0, connected=True)
        quiet += 1
    assert not adaptive.active and registry.get_sample_value("gpu_exporter_forward_summarizing") == 0
    assert meter.need < 0.7 * meter.capacity
    assert adaptive.raw_allowed(3000, 0.0, until_next=2.0)


def test_a_link_that_recovers_while_no_sample_comes_gets_raw_batches_at_the_next_quiet_interval() -> None:
    meter = _measured(150.0)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    _burst(adaptive, 8, 9000, 10.0)  # 900 B/s on a 150 B/s link
    assert adaptive.active
    for mid in range(2, 6):  # summaries, each alone on the link, that is fast again
        meter.sent(mid, 4000, 100.0 * mid)
        meter.acked(mid, 100.0 * mid + 1.0, latency=0.0)
    assert meter.capacity == pytest.approx(4000)
    adaptive.idle(10.0, connected=True)
    assert not adaptive.active


def test_on_a_link_still_too_thin_a_quiet_interval_keeps_the_summaries() -> None:
    """Quiet intervals count as what they are: a link that cannot carry what the latest intervals took
    stays judged thin."""
    meter = _measured(150.0)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    _burst(adaptive, 8, 9000, 10.0)
    adaptive.idle(10.0, connected=True)
    assert meter.need == pytest.approx(7 * 9000 / 80)
    assert adaptive.active


def test_a_quiet_interval_with_the_broker_away_ends_summarising_as_a_batch_closed_then_does() -> None:
    meter = _measured(150.0)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    _burst(adaptive, 8, 9000, 10.0)
    assert adaptive.active
    adaptive.idle(10.0, connected=False)
    assert not adaptive.active
