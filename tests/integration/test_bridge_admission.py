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


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_default_budgets_admit_a_rollout_of_1000_nodes_like_a_real_8_gpu_agent(
    broker: MosquittoServer, victoria: VictoriaMetricsServer, tmp_path: Path
) -> None:
    """What one real agent on 8 simulated GPUs (its batches and its health reports) costs the bridge's
    fleet budget, times 1,000: a DaemonSet rolled out onto 1,000 such nodes fits the default
    --bridge.max-series, and its names fit the default burst of new names, so none waits and no value
    is refused by the fleet's series limit (the fleet bench runs the 1,000 nodes themselves)."""
    from gpu_exporter import config as cfg
    from gpu_exporter.bridge.settings import BridgeSettings, new_nodes_burst
    from tests.support import Exporter

    node = "edge-rollout-real"
    bridge = BridgeProcess(tmp_path, broker, victoria.write_url, "rollout-budget-bridge")
    agent = Exporter(
        "--gpu-vendor=fake",
        "--fake.gpus=8",
        "--gpu-metrics-collection-interval=1s",
        f"--node-name={node}",
        f"--mqtt.url={broker.url}",
        f"--spool.dir={tmp_path / 'spool'}",
        "--mqtt.batch-interval=2s",
    )
    try:
        bridge.start()
        agent.start()

        def own_series_stored() -> bool:  # the health report's series, after the first batches'
            return bool(victoria.samples(f'gpu_exporter_collect_duration_seconds{{node="{node}"}}'))

        wait_until(own_series_stored, 60, "the agent's health report in VictoriaMetrics")
        counts = [bridge.metric("gpu_exporter_bridge_active_series")]
        while len(counts) < 3 or counts[-1] != counts[-2]:  # settled: a few batches more
            assert len(counts) < 20, counts
            time.sleep(2)
            counts.append(bridge.metric("gpu_exporter_bridge_active_series"))
        per_node = counts[-1]
        assert per_node > 8 * 100  # the GPUs' series and the agent's own
    finally:
        agent.stop()
        bridge.stop()
    defaults = cfg.Config()
    assert 1000 * per_node <= defaults.bridge_max_series, per_node
    settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url="http://127.0.0.1:1/")
    assert new_nodes_burst(settings) >= 1000
