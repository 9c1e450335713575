"""Two bridge replicas in one MQTT 5 shared subscription: both take work, and one killed mid-stream
loses nothing once it is back under its client id."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from gpu_exporter.payload import encode
from tests.support.bridge_helpers import BridgeProcess, Publisher, expected_points, make_batch, stored_points
from tests.support.tsdb import MosquittoServer, PrometheusServer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODES = [f"edge-r{i}" for i in range(4)]
BATCHES = 40  # per node


def test_two_replicas_share_the_work_and_a_killed_one_loses_nothing(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    prom = PrometheusServer(tmp_path / "prom", ooo_window="2h")
    broker.start()
    prom.start()
    group = ("--bridge.group=cloud",)
    one = BridgeProcess(tmp_path, broker, prom.write_url, "replica-1", *group)
    two = BridgeProcess(tmp_path, broker, prom.write_url, "replica-2", *group)
    t0 = time.time() - 1800
    batches = [
        make_batch(node, "boot", list(range(b * 6 + 1, b * 6 + 7)), t0 + b * 30, gpus=2)
        for b in range(BATCHES)
        for node in NODES
    ]
    published = threading.Event()
    progress = [0]

    def publish() -> None:
        pub = Publisher(broker.port, "replica-test-publisher")
        try:
            for i, batch in enumerate(batches):
                pub.publish(f"gpu-exporter/{batch.node}/batch", encode(batch))
                progress[0] = i + 1
                time.sleep(0.01)
        finally:
            pub.close()
            published.set()

    try:
        one.start()
        two.start()
        sender = threading.Thread(target=publish, daemon=True)
        sender.start()
        wait_until(lambda: progress[0] >= len(batches) // 3, 60, "a third of the batches published")
        taken_by_two = two.metric("gpu_exporter_bridge_messages_received_total")
        taken_by_one = one.metric("gpu_exporter_bridge_messages_received_total")
        two.stop(signal.SIGKILL)  # mid-stream, with whatever it had not acknowledged
        time.sleep(1.0)
        two.start()  # back under the same client id: its session holds its share
        assert published.wait(120), "publisher did not finish"
        want = set().union(*(expected_points(b) for b in batches))
        selector = '{node=~"edge-r.*",__name__=~"gpu_.+"}'
        wait_until(lambda: want <= stored_points(prom.samples(selector)), 60, "every sample", interval=1.0)
        assert taken_by_one > 0 and taken_by_two > 0, (taken_by_one, taken_by_two)
    finally:
        one.stop(signal.SIGKILL)
        two.stop(signal.SIGKILL)
        prom.stop()
        broker.stop()
