"""Admission without loss, through a real Mosquitto into a real VictoriaMetrics: a fleet larger than the
bridge's burst of new node names rolls out onto a running bridge; the names past the burst are held back,
unacknowledged, and admitted as the bucket refills, and every sample of every node is stored once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpu_exporter.payload import encode
from tests.support.bridge_helpers import BridgeProcess, Publisher, make_batch
from tests.support.tsdb import MosquittoServer, VictoriaMetricsServer, mosquitto_fixture, victoria_fixture, wait_until

victoria = victoria_fixture()
broker = mosquitto_fixture()

NODES = 8
BATCHES = 3  # per node, of 3 samples each: sequence numbers 1-9
BURST = 2
PER_MINUTE = 30  # a token every 2 s: the six names past the burst are in within about 12 s


def _stamps(victoria: VictoriaMetricsServer, node: str) -> list[int]:
    series = victoria.samples(f'gpu_up{{node="{node}",gpu="0"}}')
    return sorted(t for points in series.values() for t, _ in points)


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_rollout_past_the_burst_is_held_back_then_admitted_with_every_sample_stored_once(
    broker: MosquittoServer, victoria: VictoriaMetricsServer, tmp_path: Path
) -> None:
    t0 = time.time() - 600
    nodes = [f"edge-rollout-{i}" for i in range(NODES)]
    batches = {
        n: [make_batch(n, "boot-1", list(range(3 * b + 1, 3 * b + 4)), t0 + 15 * b, gpus=1) for b in range(BATCHES)]
        for n in nodes
    }
    args = (f"--bridge.new-nodes-burst={BURST}", f"--bridge.new-nodes-per-minute={PER_MINUTE}")
    bridge = BridgeProcess(tmp_path, broker, victoria.write_url, "admission", *args).start()
    pub = Publisher(broker.port, client_id="rollout")
    try:
        for b in range(BATCHES):  # the fleet's nodes publish in turn, as a rollout's do
            for n in nodes:
                pub.publish(f"gpu-exporter/{n}/batch", encode(batches[n][b]))
        # every batch was taken by the broker; those of the names past the burst wait in the bridge
        wait_until(lambda: bridge.metric("gpu_exporter_bridge_held_back_messages") > 0, 30, "batches held back")
        assert bridge.metric("gpu_exporter_bridge_held_back_nodes") <= NODES - BURST
        assert bridge.metric("gpu_exporter_bridge_held_back_oldest_seconds") >= 0
        wanted = {n: sorted(round(s.timestamp * 1000) for bt in batches[n] for s in bt.samples) for n in nodes}
        wait_until(
            lambda: all(_stamps(victoria, n) == wanted[n] for n in nodes), 90, "every sample of every node stored"
        )
        assert bridge.metric("gpu_exporter_bridge_held_back_messages") == 0
        assert bridge.metric("gpu_exporter_bridge_new_nodes_total") == NODES
        assert bridge.metric("gpu_exporter_bridge_new_nodes_refused_total") == 0
        # at least the first batch of each name past the burst waited
        assert bridge.metric("gpu_exporter_bridge_held_back_total") >= NODES - BURST
        assert bridge.metric("gpu_exporter_bridge_duplicate_samples_total") == 0
        assert "holding back the batches of new node" in bridge.log.read_text()
    finally:
        pub.close()
        bridge.stop()
    # nothing written twice (VictoriaMetrics without dedup stores a duplicate twice) or lost
    for n in nodes:
        assert _stamps(victoria, n) == wanted[n]
