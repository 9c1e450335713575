"""Timestamps the bridge must never write, at the edges of its clock rules (bridge/clock.py): before
1970, and after its own clock once a node's lead of a fraction of a second has been corrected. The
bridge's real decode, clock and write path runs against a receiver that records every request."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.clock import Stamp
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch


def test_samples_stamped_before_1970_are_refused_and_counted_the_rest_written() -> None:
    """A node whose clock reads before 1970 (a board without a battery, its clock reset and stepped
    back) and that sends no send time (MQTT 3.1.1: no skew to correct by)."""
    # ten samples 5 s apart from 20 s before the epoch: -20, -15, -10, -5, 0, 5, ..., 25 s
    batch = make_batch("edge-1969", "boot-1", list(range(1, 11)), -20.0, gpus=1)
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        registry = CollectorRegistry()
        settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=rx.url)
        written = Bridge(settings, registry).process(
            [Received(1, 1, "gpu-exporter/edge-1969/batch", encode(batch), None)]
        )
    stamps = sorted(
        {
            t
            for req in rx.requests
            for labels, points in req.series
            if ("node", "edge-1969") in labels
            for t, _ in points
        }
    )
    assert stamps == [0, 5000, 10000, 15000, 20000, 25000]  # none before the epoch, every one after it
    assert written > 0
    refused = registry.get_sample_value(
        "gpu_exporter_bridge_edge_samples_refused_total", {"node": "edge-1969", "reason": "before_epoch"}
    )
    assert refused == 4


def test_a_lead_of_a_fraction_of_a_second_is_corrected_by_whole_seconds_up_never_into_the_future() -> None:
    """A node 1.4 s ahead publishes a sample it took just now (by its clock, 1.35 s after the bridge's
    now): the correction moves it back by 2 s, not 1 s, so it lands in the past and is written."""
    now = time.time()
    node = "edge-ahead-1400ms"
    batch = make_batch(node, "boot-1", [1, 2, 3, 4], now + 1.35 - 3 * 0.2, gpus=1, step=0.2)
    stamp = Stamp(received_ms=round(now * 1000), sent_ms=round(now * 1000) + 1400)
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        registry = CollectorRegistry()
        settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=rx.url)
        Bridge(settings, registry).process([Received(1, 1, f"gpu-exporter/{node}/batch", encode(batch), stamp)])
    stamps = sorted(
        {t for req in rx.requests for labels, points in req.series if ("node", node) in labels for t, _ in points}
    )
    assert len(stamps) == 4 and max(stamps) <= now * 1000 + 1  # every sample written, none after the bridge's now
    future = registry.get_sample_value(
        "gpu_exporter_bridge_edge_samples_refused_total", {"node": node, "reason": "future"}
    )
    assert not future
