"""A node whose clock reads before 1970 (a board without a battery, its clock reset and stepped back)
and that sends no send time (an MQTT 3.1.1 agent, so no skew to correct by): the bridge refuses and
counts the samples stamped before the epoch, and writes the rest with their own timestamps."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.service import Bridge, BridgeSettings, Received
from gpu_exporter.forward.batch import encode

from .bridge_helpers import ScriptedReceiver, make_batch


def test_samples_stamped_before_1970_are_refused_and_counted_the_rest_written() -> None:
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
