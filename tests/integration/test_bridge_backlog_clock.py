"""A backlog is not a clock behind (the bench's backlog re-run stored ~300k samples at timestamps no node
sent): real Mosquitto, a real bridge process whose remote-write receiver takes a second per write, and
batches published faster than that, so that later ones wait at the bridge's in-flight bound longer than
--bridge.max-clock-skew. Mosquitto 2.0.11 writes them out (stamping their expiry) long before the bridge
reads them, so the wait is not in the broker's hold time.

Every sample of a node whose clock is right lands at the timestamp it sent, none is counted corrected;
a node whose clock is an hour behind, in the same backlog, is still corrected (counted, moved to about
when its samples were taken)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from gpu_exporter.mqtt import sendtime
from gpu_exporter.payload import encode
from tests.support.bridge_helpers import BridgeProcess, ScriptedReceiver, expected_points, make_batch, stored_points
from tests.support.tsdb import MosquittoServer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

WRITE_S = 1.0  # each remote write takes this long
BATCHES = 16  # of the healthy node, published at once
BEHIND_S = 3600.0


def _stall(n: int) -> tuple[int, bytes, dict[str, str]]:
    time.sleep(WRITE_S)
    return 204, b"", {}


def _corrected(page: str, node: str) -> float:
    m = re.search(rf'^gpu_exporter_bridge_edge_samples_corrected_total\{{node="{node}"\}} (\S+)$', page, re.M)
    return float(m.group(1)) if m else 0.0


def _skew(page: str, node: str) -> float:
    m = re.search(rf'^gpu_exporter_node_clock_skew_seconds\{{node="{node}"\}} (\S+)$', page, re.M)
    assert m, f"no skew measured for {node}"
    return float(m.group(1))


def test_a_backlog_is_not_taken_for_a_clock_behind(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    broker.start()
    with ScriptedReceiver(_stall) as rx:
        bridge = BridgeProcess(
            tmp_path,
            broker,
            rx.url,
            "backlog-clock",
            "--bridge.max-inflight=2",
            "--bridge.max-clock-skew=1s",
        )
        bridge.start()
        try:
            pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="backlog-pub", protocol=mqtt.MQTTv5)
            pub.connect("127.0.0.1", broker.port)
            pub.loop_start()
            now = time.time()
            healthy = [make_batch("edge-ok", "boot-1", [i], now - 10 + i * 0.1, gpus=1) for i in range(1, BATCHES + 1)]
            late = make_batch("edge-late", "boot-1", [1], now - BEHIND_S - 5, gpus=1)
            infos = [
                pub.publish("gpu-exporter/edge-ok/batch", encode(b), qos=1, properties=sendtime.properties())
                for b in healthy
            ]
            # the late node's clock is an hour behind: its send time and its samples both
            infos.append(
                pub.publish(
                    "gpu-exporter/edge-late/batch",
                    encode(late),
                    qos=1,
                    properties=sendtime.properties(now=time.time() - BEHIND_S),
                )
            )
            for info in infos:
                info.wait_for_publish(10)
                assert info.is_published()
            pub.disconnect()
            pub.loop_stop()

            def stored(node: str) -> set[tuple[frozenset[tuple[str, str]], int, float]]:
                return {
                    p
                    for r in list(rx.requests)
                    for labels, pts in r.series
                    if ("node", node) in labels
                    for p in stored_points({frozenset(labels): pts})
                }

            want = set().union(*(expected_points(b) for b in healthy))
            wait_until(lambda: len(rx.requests) >= 1 + BATCHES // 2 and stored("edge-late"), 90, "the backlog written")
            page = bridge.page().decode()
        finally:
            bridge.stop()
            broker.stop()
    sent = {round(s.timestamp * 1000) for b in healthy for s in b.samples}
    assert {t for _, t, _ in stored("edge-ok")} == sent, "a healthy node's samples stored at times it did not send"
    assert want <= stored("edge-ok")
    assert _corrected(page, "edge-ok") == 0
    assert abs(_skew(page, "edge-ok")) < 1.0
    # the node an hour behind is still seen and corrected, to within the backlog's wait
    assert _corrected(page, "edge-late") > 0
    assert -BEHIND_S - 2 < _skew(page, "edge-late") < -BEHIND_S + BATCHES * WRITE_S + 5
    late_times = {t for _, t, _ in stored("edge-late")}
    assert late_times and all(abs(t / 1000 - (now - 5)) < BATCHES * WRITE_S + 5 for t in late_times)
