"""The bridge trusts no edge node (issue 13): one node's clock, name, cardinality or a refusing receiver
must not hurt the fleet's data or hide behind healthy-looking metrics.

The bridge runs its real decode, clock, convert and write path (``Bridge.process``) against an HTTP
remote-write receiver that records what it was sent; messages carry the stamps paho would hand over.
"""

from __future__ import annotations

import logging
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.clock import Stamp, stamp_of
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.mqtt import sendtime
from gpu_exporter.payload import Batch, encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch

DAY = 86400.0


def _bridge(url: str, **kw: object) -> tuple[Bridge, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=url, rw_backoff_max=0.05, **kw)  # type: ignore[arg-type]
    return Bridge(settings, registry), registry


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def _msg(batch: Batch, stamp: Stamp | None, topic_node: str | None = None, mid: int = 1) -> Received:
    return Received(mid, 1, f"gpu-exporter/{topic_node or batch.node}/batch", encode(batch), stamp)


def _written(rx: ScriptedReceiver, node: str) -> list[int]:
    """Every timestamp (ms) written for ``node``."""
    return [t for req in rx.requests for labels, points in req.series if ("node", node) in labels for t, _ in points]


def _ok(n: int) -> tuple[int, bytes, dict[str, str]]:
    return 204, b"", {}


def test_a_node_400_days_ahead_is_corrected_and_nothing_lands_in_the_future() -> None:
    now = time.time()
    ahead = 400 * DAY
    node = "edge-ahead"
    # sampled over the last minute by a clock 400 days fast, published 2 s ago, held 1 s by the broker
    batch = make_batch(node, "b1", list(range(1, 13)), now + ahead - 60)
    stamp = Stamp(received_ms=round(now * 1000), sent_ms=round((now + ahead - 2) * 1000), held_ms=1000)
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url)
        bridge.process([_msg(batch, stamp)])
        after = time.time()
    stamps = _written(rx, node)
    assert stamps, "a corrected batch is written"
    assert max(stamps) <= after * 1000
    assert min(stamps) >= (now - 70) * 1000  # where the samples really were taken, within the minute
    skew = _value(registry, "gpu_exporter_node_clock_skew_seconds", node=node)
    assert skew == pytest.approx(ahead - 1, abs=1)
    assert _value(registry, "gpu_exporter_bridge_edge_samples_corrected_total", node=node) == 12


def test_a_node_an_hour_behind_is_corrected_forward() -> None:
    now = time.time()
    node = "edge-behind"
    batch = make_batch(node, "b1", list(range(1, 7)), now - 3600 - 30)
    stamp = Stamp(received_ms=round(now * 1000), sent_ms=round((now - 3600) * 1000))
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url)
        bridge.process([_msg(batch, stamp)])
    stamps = _written(rx, node)
    assert min(stamps) >= (now - 31) * 1000 and max(stamps) <= now * 1000
    assert _value(registry, "gpu_exporter_node_clock_skew_seconds", node=node) == pytest.approx(-3600, abs=1)


def test_refuse_policy_refuses_and_counts_per_node_and_a_healthy_node_is_untouched() -> None:
    now = time.time()
    bad = make_batch("edge-bad", "b1", [1, 2, 3], now + DAY)
    good = make_batch("edge-good", "b1", [1, 2, 3], now - 20)
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url, clock_skew_policy="refuse")
        bridge.process(
            [
                _msg(bad, Stamp(round(now * 1000), round((now + DAY + 10) * 1000)), mid=1),
                _msg(good, Stamp(round(now * 1000), round(now * 1000) - 300), mid=2),
            ]
        )
    assert _written(rx, "edge-bad") == []
    assert _value(registry, "gpu_exporter_bridge_edge_samples_refused_total", node="edge-bad", reason="clock_skew") == 3
    # the healthy node's timestamps are exactly its own
    assert sorted(set(_written(rx, "edge-good"))) == [round(s.timestamp * 1000) for s in good.samples]
    assert _value(registry, "gpu_exporter_bridge_edge_samples_corrected_total", node="edge-good") == 0


def test_a_small_lead_within_the_tolerance_is_still_never_written_in_the_future() -> None:
    now = time.time()
    node = "edge-2min"
    batch = make_batch(node, "b1", [1, 2, 3, 4], now + 120 - 15)  # two minutes fast, up to the last second
    stamp = Stamp(round(now * 1000), round((now + 120) * 1000))
    with ScriptedReceiver(_ok) as rx:
        bridge, _ = _bridge(rx.url)
        bridge.process([_msg(batch, stamp)])
    stamps = _written(rx, node)
    assert len(set(stamps)) == 4 and max(stamps) <= round(now * 1000)


@pytest.mark.parametrize("future_ms", [(1 << 53) - 1, None])
def test_without_a_send_time_samples_after_the_bridge_clock_are_refused(future_ms: int | None) -> None:
    """An MQTT 3.1.1 agent stamps nothing: its future samples, and a payload at 2^53-1 ms, are refused."""
    now = time.time()
    node = "edge-311"
    far = (future_ms or round((now + 3600) * 1000)) / 1000
    samples = [make_batch(node, "b1", [1], now - 10).samples[0], make_batch(node, "b1", [2], far).samples[0]]
    batch = Batch(node, "b1", tuple(samples))
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url)
        bridge.process([_msg(batch, None)])
    assert sorted(set(_written(rx, node))) == [round((now - 10) * 1000)]
    assert _value(registry, "gpu_exporter_bridge_edge_samples_refused_total", node=node, reason="future") == 1


def test_stamp_from_mqtt5_properties_accounts_for_the_broker_hold_time() -> None:
    props = sendtime.properties(now=1000.0)
    stamp = stamp_of(props, received=1000.5)
    assert (stamp.sent_ms, stamp.held_ms) == (1_000_000, 0)
    props.MessageExpiryInterval = sendtime.EXPIRY_S - 3600  # held an hour by the broker
    stamp = stamp_of(props, received=4600.5)
    assert stamp.skew_ms == -500
    garbled = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    garbled.UserProperty = [("sent", "not a number")]
    assert stamp_of(garbled, received=1.0).sent_ms is None
    assert stamp_of(None, received=1.0) == Stamp(1000)


def test_a_payload_naming_another_node_than_its_topic_is_refused_and_counted() -> None:
    now = time.time()
    forged = make_batch("edge-victim", "b1", [1, 2], now - 10)
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url)
        bridge.process([_msg(forged, Stamp(round(now * 1000)), topic_node="edge-attacker")])
    assert rx.requests == []
    assert (
        _value(registry, "gpu_exporter_bridge_payloads_dropped_total", node="edge-attacker", reason="node_mismatch")
        == 1
    )


@pytest.mark.parametrize("status", [401, 302])
def test_refusals_do_not_advance_written_last_write_or_lag(status: int) -> None:
    now = time.time()
    batch = make_batch("edge-r", "b1", [1, 2, 3], now - 10)
    with ScriptedReceiver(lambda n: (status, b"no", {"Location": "http://elsewhere/"})) as rx:
        bridge, registry = _bridge(rx.url)
        bridge.process([_msg(batch, Stamp(round(now * 1000)))])
    assert rx.requests
    assert _value(registry, "gpu_exporter_bridge_samples_written_total") == 0
    assert _value(registry, "gpu_exporter_bridge_gpu_samples_written_total") == 0
    assert _value(registry, "gpu_exporter_bridge_last_write_timestamp_seconds") == 0
    assert _value(registry, "gpu_exporter_bridge_lag_seconds") == 0
    assert _value(registry, "gpu_exporter_bridge_samples_rejected_total", reason="client_error") > 0


def _wide_batch(node: str, series: int, t: float, offset: int = 0) -> Batch:
    """One sample of one GPU with ``series`` distinct XID series (a node creating series at will)."""
    values = {("xid_errors", (str(offset + i),)): 1.0 for i in range(series)}
    device = DeviceSample(DeviceId("0", f"GPU-{node}"), True, values, {})
    return Batch(node, "b1", (Sample(1 + offset, t, (device,)),))


def test_per_node_series_limit_counts_logs_once_and_spares_other_nodes(caplog: pytest.LogCaptureFixture) -> None:
    now = time.time()
    with ScriptedReceiver(_ok) as rx, caplog.at_level(logging.WARNING):
        bridge, registry = _bridge(rx.url, max_series_per_node=100)
        bridge.process([_msg(_wide_batch("edge-flood", 300, now - 5), Stamp(round(now * 1000)), mid=1)])
        bridge.process([_msg(_wide_batch("edge-flood", 300, now - 4, 300), Stamp(round(now * 1000)), mid=2)])
        bridge.process([_msg(_wide_batch("edge-calm", 50, now - 5), Stamp(round(now * 1000)), mid=3)])
    flood = {tuple(labels) for req in rx.requests for labels, _ in req.series if ("node", "edge-flood") in labels}
    calm = {tuple(labels) for req in rx.requests for labels, _ in req.series if ("node", "edge-calm") in labels}
    assert len(flood) == 100  # gpu_up and 99 XID series; nothing of the second batch's new series
    assert len(calm) == 51
    assert _value(registry, "gpu_exporter_bridge_series_limited_total", node="edge-flood", reason="node") == 201 + 300
    assert sum("edge-flood" in r.getMessage() and "max-series-per-node" in r.getMessage() for r in caplog.records) == 1
