"""The path the KubeEdge deployment no longer takes, run to show where it loses data: the agent
publishes to a Mosquitto on its own node, which a Mosquitto bridge forwards to the cloud broker through
the WAN (tests/support/tcp_proxy.py). The edge broker acknowledges each batch at once, so the agent's spool
empties while the WAN is down and the bridge's queue is all that holds the outage.

Configured as such a bridge would be, with a persistent session (``cleansession false``) and the queue
limit of KubeEdge's Mosquitto 1.6 (100 messages), the outage that tests/integration/test_topology.py carries with 0
lost on the direct path loses samples here, and the agent counts none of them as dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.test_topology import FAST, LARGEST_QUEUE, NODE
from tests.support.deployed import Cloud, Manifest, NodePaths, cloud_fixture, node_agent, provision_node_credentials  # noqa: F401
from tests.support.mosquitto import wait_until
from tests.support.tsdb import MosquittoServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class EdgeBroker(MosquittoServer):
    """A Mosquitto on the edge node, bridged to the cloud broker with this node's certificate."""

    name = "edge-broker"

    def __init__(self, workdir: Path, wan_port: int, node_dir: Path, max_queued: int) -> None:
        super().__init__(workdir)
        self.config_path.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {workdir}/\nautosave_interval 1\n"
            f"max_queued_messages {max_queued}\nlog_dest stdout\n"
            "connection cloud\n"
            f"address 127.0.0.1:{wan_port}\n"
            "topic gpu-exporter/# out 1\n"
            "cleansession false\n"
            f"remote_clientid {NODE}-bridge\n"
            "keepalive_interval 5\n"
            "restart_timeout 1\n"
            f"bridge_cafile {node_dir / 'ca.crt'}\n"
            f"bridge_certfile {node_dir / 'tls.crt'}\n"
            f"bridge_keyfile {node_dir / 'tls.key'}\n" + ("user root\n" if os.geteuid() == 0 else "")
        )


@pytest.mark.parametrize("cloud", ["victoria-metrics"], indirect=True)
def test_a_local_broker_with_a_bridge_loses_what_its_queue_cannot_hold(cloud: Cloud, tmp_path: Path) -> None:
    manifest = Manifest.load()
    root = tmp_path / NODE
    local = {"mqtt.url": "", "mqtt.tls.ca-file": "", "mqtt.tls.cert-file": "", "mqtt.tls.key-file": ""}
    paths = NodePaths(manifest, root)
    provision_node_credentials(paths, manifest, cloud.tls, NODE)  # the bridge's certificate now
    node_dir = paths.host("/etc/gpu-exporter/mqtt")
    edge = EdgeBroker(tmp_path / "edge-broker", cloud.wan.port, node_dir, max_queued=LARGEST_QUEUE)
    edge.start()
    agent = node_agent(manifest, root, NODE, "unused:1", {**FAST, **local, "mqtt.url": edge.url})
    agent.start()
    try:
        assert wait_until(lambda: cloud.seen.count() >= 5, 20), edge.log()
        taken_before = agent.gauge("gpu_exporter_collects_total")
        cloud.wan.cut()
        assert wait_until(lambda: agent.gauge("gpu_exporter_collects_total") - taken_before > LARGEST_QUEUE + 10, 40)
        # the agent's spool stayed empty: the broker on its node acknowledged every batch at once
        assert agent.gauge("gpu_exporter_forward_connected") == 1
        # (what waits for its PUBACK is in the spool too: on a loaded machine a few batches, for a moment)
        assert wait_until(lambda: agent.gauge("gpu_exporter_forward_spool_batches") <= 2, 20)
        cloud.wan.restore()
        taken = int(agent.gauge("gpu_exporter_collects_total"))
        (boot,) = cloud.seen.seqs()
        # wait until the cloud has what will come: samples taken after the restore arrive again
        assert wait_until(lambda: max(cloud.seen.seqs(boot)[boot]) >= taken + 10, 30), edge.log()
        lost = sorted(set(range(1, taken + 1)) - cloud.seen.seqs(boot)[boot])
        dropped = sum(
            v for k, v in agent.metrics().items() if k.startswith("gpu_exporter_forward_dropped_samples_total")
        )
        print(f"\nlocal broker + bridge: {taken} samples taken, {len(lost)} lost ({lost[:3]}..{lost[-3:]})")
        assert len(lost) > 0  # lost on the bridge's queue...
        assert dropped == 0  # ...and the agent, whose spool was empty, counted nothing
    finally:
        agent.stop()
        edge.stop()
