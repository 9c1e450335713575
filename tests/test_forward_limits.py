"""MQTT 5 limits a real Mosquitto announces in CONNACK, obeyed by the forwarder, seen on the wire.

Mosquitto 2.0 announces ``max_packet_size`` as Maximum Packet Size, ``max_inflight_messages`` as Receive
Maximum, ``retain_available false`` as Retain Available 0 and ``max_qos 0`` as Maximum QoS 0. A proxy
between agent and broker (tests/mqtt_proxy.py) reads every packet: the size of each PUBLISH, how many are
unacknowledged at once, how many connections the broker accepted.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.forward.service import Forwarder
from gpu_exporter.forward.spool import Spool
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.ring import RingBuffer

from .mosquitto import Broker, Collector, wait_until
from .mqtt_proxy import Proxy
from .test_forward_service import make_config, make_sample, metric

pytestmark = pytest.mark.integration


@pytest.fixture
def limited(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Broker, Proxy]]:
    """A Mosquitto with the limits given as the fixture's parameter, behind a measuring proxy."""
    broker = Broker(tmp_path / "mosquitto", extra=getattr(request, "param", ""))
    broker.start()
    try:
        with Proxy(broker.port) as proxy:
            yield broker, proxy
    finally:
        broker.stop()


def start(tmp_path: Path, broker: Broker, proxy: Proxy, ring: RingBuffer, **overrides: str) -> tuple[Forwarder, Any]:
    registry = CollectorRegistry()
    config = make_config(tmp_path, broker, **{"mqtt.url": proxy.url, **overrides})
    fwd = Forwarder(config, ring, registry)
    fwd.start()
    assert fwd.ready.wait(10)
    return fwd, registry


def big_sample(seq: int, devices: int = 40) -> Sample:
    """A node with many devices and incompressible readings: one sample of several KiB."""
    rng = random.Random(seq)
    keys = list(make_sample(seq, noisy=True).devices[0].values)
    devs = tuple(
        DeviceSample(
            DeviceId(str(i), f"GPU-{i:04d}"), True, {k: float(rng.getrandbits(48)) for k in keys}, {"name": "sim"}
        )
        for i in range(devices)
    )
    return Sample(seq, time.time(), devs)


@pytest.mark.parametrize("limited", ["max_packet_size 2048\nmax_inflight_messages 2\n"], indirect=True)
def test_a_small_maximum_packet_size_and_receive_maximum_2_still_get_every_sample(
    tmp_path: Path, limited: tuple[Broker, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    broker, proxy = limited
    caplog.set_level(logging.INFO, "gpu_exporter.forward")
    ring = RingBuffer(2048)
    with Collector(broker) as sub:
        proxy.blocked = True  # an outage first: batches grow past what the broker takes
        fwd, registry = start(tmp_path, broker, proxy, ring)
        try:
            for seq in range(1, 301):
                ring.append(make_sample(seq, noisy=True))
                time.sleep(0.005)
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") >= 2, 10)
            proxy.blocked = False
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, 301)), 60), sub.seqs()
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") == 0, 10)
        finally:
            fwd.stop(5)
    assert "over the broker's Maximum Packet Size" in caplog.text  # the backlog did need splitting
    with proxy.wire.lock:
        assert max(proxy.wire.publish_sizes) <= 2048
        assert proxy.wire.max_inflight <= 2  # the status message included
        assert len(proxy.wire.connacks) == 1  # never disconnected for an oversized packet
    assert "oversize" not in broker.log()
    assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="too_large") == 0


@pytest.mark.parametrize("limited", ["max_packet_size 1024\n"], indirect=True)
def test_a_sample_that_cannot_fit_is_dropped_counted_and_said_once(
    tmp_path: Path, limited: tuple[Broker, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    broker, proxy = limited
    ring = RingBuffer(256)
    with Collector(broker) as sub:
        fwd, registry = start(tmp_path, broker, proxy, ring, **{"mqtt.batch-max-samples": "1"})
        try:
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_connected") == 1, 10)
            for seq in range(1, 11):
                ring.append(big_sample(seq) if seq in (3, 7) else make_sample(seq))
                time.sleep(0.02)
            expected = set(range(1, 11)) - {3, 7}
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == expected, 20), sub.seqs()
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") == 0, 10)
        finally:
            fwd.stop(5)
    assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="too_large") == 2
    lines = [r.getMessage() for r in caplog.records if "Maximum Packet Size of 1024" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "max_packet_size" in lines[0]
    with proxy.wire.lock:
        assert max(proxy.wire.publish_sizes) <= 1024
        assert len(proxy.wire.connacks) == 1


@pytest.mark.parametrize("limited", ["retain_available false\n"], indirect=True)
def test_a_broker_without_retained_messages_gets_the_batches_and_an_unretained_status(
    tmp_path: Path, limited: tuple[Broker, Proxy]
) -> None:
    broker, proxy = limited
    ring = RingBuffer(64)
    with Collector(broker) as sub:
        fwd, _ = start(tmp_path, broker, proxy, ring)
        try:
            for seq in range(1, 6):
                ring.append(make_sample(seq))
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == {1, 2, 3, 4, 5}, 15), broker.log()
            assert sub.status.get("gpu-exporter/node-a/status") == b"online"
        finally:
            fwd.stop(5)
    with proxy.wire.lock:
        assert len(proxy.wire.connacks) == 2  # refused once for the retained will, then without it


@pytest.mark.parametrize("limited", ["max_qos 0\n"], indirect=True)
def test_a_broker_that_allows_qos_0_only_is_refused_loudly_and_the_spool_keeps_every_sample(
    tmp_path: Path, limited: tuple[Broker, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    broker, proxy = limited
    ring = RingBuffer(64)
    fwd, registry = start(tmp_path, broker, proxy, ring, **{"mqtt.protocol": "5"})
    try:
        for seq in range(1, 6):
            ring.append(make_sample(seq))
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_connect_errors_total", kind="qos") >= 1, 15)
        ok, why = fwd.health()
        assert not ok and "Maximum QoS 0" in why
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_working") == 0, 5)
    finally:
        fwd.stop(5)
    assert any("at-least-once delivery is impossible" in r.getMessage() for r in caplog.records)
    spool = Spool(fwd.config.spool_dir, 1 << 30, 1e9)
    journal = spool.open()
    kept = {s for e in spool.entries() for s in range(e.first_seq, e.last_seq + 1)}
    spool.close()
    assert kept | {int(k.rsplit(".", 1)[1]) for k, _ in journal} == {1, 2, 3, 4, 5}  # nothing lost


def test_a_burst_of_backlog_fills_the_window_without_publish_errors(
    tmp_path: Path, limited: tuple[Broker, Proxy]
) -> None:
    """The retained status message has a slot of its own: a full window of batches is never refused."""
    broker, proxy = limited
    proxy.latency = 0.3  # a WAN round trip: the window fills before the status message's PUBACK is back
    ring = RingBuffer(1024)
    with Collector(broker) as sub:
        proxy.blocked = True
        fwd, registry = start(
            tmp_path, broker, proxy, ring, **{"mqtt.batch-max-samples": "2", "spool.replay-rate": "1000"}
        )
        try:
            for seq in range(1, 121):
                ring.append(make_sample(seq))
                time.sleep(0.01)  # a turn each: batches of 2 samples
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") >= 40, 10)
            proxy.blocked = False
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, 121)), 30)
        finally:
            fwd.stop(5)
    assert metric(registry, "gpu_exporter_forward_publish_errors_total") == 0  # none refused, none lost
    with proxy.wire.lock:
        assert proxy.wire.max_inflight == 17  # a full window of batches, and the status message


@pytest.mark.parametrize("limited", ["max_qos 0\n"], indirect=True)
def test_the_bridge_says_when_the_broker_grants_its_subscription_qos_0_only(
    limited: tuple[Broker, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    from gpu_exporter.bridge.service import Bridge, BridgeSettings

    broker, _ = limited
    settings = BridgeSettings(mqtt_url=broker.url, remote_write_url="http://127.0.0.1:9/api/v1/write")
    bridge = Bridge(settings, CollectorRegistry())
    bridge.start()
    try:
        assert bridge.wait_connected(10)
    finally:
        bridge.stop(5)
    assert any("granted QoS 0 only" in r.getMessage() for r in caplog.records)
