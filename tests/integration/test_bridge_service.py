"""The bridge service with real Mosquitto, Prometheus and VictoriaMetrics: ack after write, replays,
bad payloads, liveness."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge import service
from gpu_exporter.bridge.service import Bridge
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import Batch, encode
from tests.support.bridge_helpers import Publisher, ScriptedReceiver, expected_points, make_batch, stored_points
from tests.support.tsdb import (
    MosquittoServer,
    PrometheusServer,
    VictoriaMetricsServer,
    mosquitto_fixture,
    prometheus_fixture,
    victoria_fixture,
    wait_until,
)

pytestmark = pytest.mark.integration


broker = mosquitto_fixture()


victoria = victoria_fixture()
prometheus = prometheus_fixture("6h")


class Running:
    def __init__(self, broker: MosquittoServer, write_url: str, **kw: object) -> None:
        self.registry = CollectorRegistry()
        settings = BridgeSettings(
            mqtt_url=broker.url,
            remote_write_url=write_url,
            topic_prefix=kw.pop("prefix", "t"),  # type: ignore[arg-type]
            rw_backoff_max=0.2,
            **kw,  # type: ignore[arg-type]
        )
        self.bridge = Bridge(settings, self.registry)
        self.bridge.start()
        assert self.bridge.wait_connected(10), "bridge did not connect"

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def stop(self) -> None:
        self.bridge.stop(5)


def _node() -> str:
    return f"edge-{uuid.uuid4().hex[:8]}"


def test_batches_arrive_in_prometheus_with_original_timestamps_and_node_label(
    broker: MosquittoServer, prometheus: PrometheusServer
) -> None:
    node = _node()
    t0 = time.time() - 3600  # an hour-old backlog, inside the out-of-order window
    batches = [
        make_batch(node, "boot-1", list(range(i * 10 + 1, i * 10 + 11)), t0 + i * 50, mig=True) for i in range(6)
    ]
    bridge = Running(broker, prometheus.write_url, client_id=f"b-{node}")
    pub = Publisher(broker.port)
    try:
        for b in reversed(batches):  # newest first, as a forwarder drains after an outage
            pub.publish(f"t/{node}/batch", encode(b))
        want = set().union(*(expected_points(b) for b in batches))
        wait_until(
            lambda: want <= stored_points(prometheus.samples(f'{{node="{node}",__name__=~"gpu_.+"}}')),
            20,
            "every sample in Prometheus",
        )
        up = prometheus.samples(f'gpu_up{{node="{node}"}}')
        assert len(up) == 2 and all(len(v) == 60 for v in up.values())
        info = prometheus.samples(f'gpu_info{{node="{node}"}}')
        assert {dict(k)["name"] for k in info} == {"Simulated GPU"}
        assert bridge.value("gpu_exporter_bridge_gpu_samples_written_total") == 120
        assert bridge.value("gpu_exporter_bridge_messages_received_total") == 6
        wait_until(lambda: bridge.value("gpu_exporter_bridge_queue_messages") == 0, 5, "queue to empty")
        assert 3600 - 300 - 5 < bridge.value("gpu_exporter_bridge_lag_seconds") < 3600 + 60  # data age
    finally:
        pub.close()
        bridge.stop()


def test_replays_are_written_once(broker: MosquittoServer, victoria: VictoriaMetricsServer) -> None:
    # VictoriaMetrics stores an exact duplicate twice, so a replay that got through would show.
    node = _node()
    t0 = time.time() - 600
    first = make_batch(node, "boot-1", list(range(1, 11)), t0)
    overlap = make_batch(node, "boot-1", list(range(6, 16)), t0 + 25)  # seqs 6-10 again, 11-15 new
    other_boot = make_batch(node, "boot-2", list(range(1, 6)), t0 + 100)  # same seqs, new boot: not a replay
    bridge = Running(broker, victoria.write_url, client_id=f"b-{node}")
    pub = Publisher(broker.port)
    try:
        for b in (first, first, overlap, other_boot):
            pub.publish(f"t/{node}/batch", encode(b))
        wait_until(
            lambda: bridge.value("gpu_exporter_bridge_gpu_samples_written_total") == 2 * 20,
            20,
            "20 samples of 2 GPUs written",
        )
        assert bridge.value("gpu_exporter_bridge_duplicate_samples_total") == 15
        stored = victoria.samples(f'{{node="{node}",__name__="gpu_power_watts"}}')
        assert sorted(len(v) for v in stored.values()) == [20, 20]
        for points in stored.values():
            assert len({t for t, _ in points}) == len(points)  # no timestamp twice
        assert bridge.bridge.dedup.ranges(node, "boot-1") == [(1, 15)]
    finally:
        pub.close()
        bridge.stop()


def test_bad_payloads_are_acked_dropped_counted_per_node_and_the_stream_goes_on(
    broker: MosquittoServer, prometheus: PrometheusServer, caplog: pytest.LogCaptureFixture
) -> None:
    node = _node()
    good = make_batch(node, "b", [1, 2, 3], time.time() - 60)
    client_id = f"b-{node}"
    bridge = Running(broker, prometheus.write_url, client_id=client_id, max_payload=64 * 1024)
    pub = Publisher(broker.port)
    try:
        pub.publish(f"t/{node}/batch", b"\x1f\x8b garbage")
        pub.publish(f"t/{node}/batch", b'{"format": "gpu-exporter.batch", "version": 99}')
        pub.publish(f"t/{node}/batch", b"{" + b" " * (100 * 1024) + b"}")
        pub.publish("t/other-node/batch", b"not json")
        pub.publish(f"t/{node}/batch", encode(good))
        wait_until(
            lambda: bridge.value("gpu_exporter_bridge_gpu_samples_written_total") == 6,
            20,
            "the good batch written",
        )
        assert bridge.value("gpu_exporter_bridge_payloads_dropped_total", node=node, reason="malformed") == 2
        assert bridge.value("gpu_exporter_bridge_payloads_dropped_total", node=node, reason="oversized") == 1
        assert bridge.value("gpu_exporter_bridge_payloads_dropped_total", node="other-node", reason="malformed") == 1
        warnings = [r.getMessage() for r in caplog.records if "dropped a" in r.getMessage()]
        assert len(warnings) == 2  # one line a minute per reason (malformed, oversized), whatever the nodes
        assert want_in(prometheus, good)
    finally:
        pub.close()
        bridge.stop()
    # they were acknowledged: a restarted bridge with the same session gets nothing again
    again = Running(broker, prometheus.write_url, client_id=client_id, max_payload=64 * 1024)
    try:
        time.sleep(1.0)
        assert again.value("gpu_exporter_bridge_messages_received_total") == 0
    finally:
        again.stop()


def want_in(prometheus: PrometheusServer, batch: object) -> bool:
    return expected_points(batch) <= stored_points(  # type: ignore[arg-type]
        prometheus.samples(f'{{node="{batch.node}",__name__=~"gpu_.+"}}')  # type: ignore[attr-defined]
    )


def test_nothing_is_acked_before_it_is_written(tmp_path: Path, broker: MosquittoServer) -> None:
    # The receiver is down: the bridge keeps retrying and acknowledges nothing. It stops; a new bridge
    # process with the same session finds every message again once the receiver is up.
    node = _node()
    server = PrometheusServer(tmp_path / "prom", ooo_window="2h")
    client_id = f"b-{node}"
    batches = [make_batch(node, "b", list(range(i * 5 + 1, i * 5 + 6)), time.time() - 300 + i * 25) for i in range(4)]
    first = Running(broker, server.write_url, client_id=client_id)
    pub = Publisher(broker.port)
    try:
        for b in batches:
            pub.publish(f"t/{node}/batch", encode(b))
        wait_until(
            lambda: first.value("gpu_exporter_bridge_write_errors_total", reason="network") >= 2,
            10,
            "failed write attempts",
        )
        assert first.value("gpu_exporter_bridge_gpu_samples_written_total") == 0
    finally:
        first.stop()
    server.start()
    second = Running(broker, server.write_url, client_id=client_id)
    try:
        want = set().union(*(expected_points(b) for b in batches))
        wait_until(
            lambda: want <= stored_points(server.samples(f'{{node="{node}",__name__=~"gpu_.+"}}')),
            20,
            "every sample after the restart",
        )
        assert second.value("gpu_exporter_bridge_messages_received_total") == 4
    finally:
        pub.close()
        second.stop()
        server.stop()


def test_each_write_group_is_acknowledged_after_its_write_and_no_other(
    broker: MosquittoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages taken at once are written in groups (bridge/service.py, GROUP_TEXT_BYTES; here one
    message a group): each group's messages are acknowledged once its write succeeded, and only they.
    The broker is the judge: after the bridge stops while the second write keeps failing, its session
    delivers again exactly what was not acknowledged."""
    monkeypatch.setattr(service, "GROUP_TEXT_BYTES", 1)
    node, now = _node(), time.time() - 600
    batches = [make_batch(node, "b", [2 * i + 1, 2 * i + 2], now + 10 * i, gpus=1) for i in range(4)]
    client_id = f"b-{node}"

    def stamps(rx: ScriptedReceiver) -> set[int]:
        return {
            t for r in rx.requests for labels, points in r.series if ("__name__", "gpu_up") in labels for t, _ in points
        }

    def of(batch: Batch) -> set[int]:
        return {round(s.timestamp * 1000) for s in batch.samples}

    pub = Publisher(broker.port)
    # the first write succeeds, the second fails for as long as the bridge runs
    with ScriptedReceiver(lambda n: (204, b"", {}) if n == 1 else (503, b"down", {})) as first_rx:
        first = Running(broker, first_rx.url, client_id=client_id, linger=3.0)
        try:
            for b in batches:  # within the linger: one take of four messages, four groups
                pub.publish(f"t/{node}/batch", encode(b))
            wait_until(lambda: len(first_rx.requests) >= 3, 20, "the first write and a failing second")
            assert stamps(first_rx) == of(batches[0]) | of(batches[1])  # written in this order, one a group
            assert first.value("gpu_exporter_bridge_gpu_samples_written_total") == 2
        finally:
            first.stop()
    with ScriptedReceiver(lambda n: (204, b"", {})) as second_rx:
        second = Running(broker, second_rx.url, client_id=client_id)
        try:
            want = of(batches[1]) | of(batches[2]) | of(batches[3])
            wait_until(lambda: want <= stamps(second_rx), 20, "what was not acknowledged, delivered again")
            wait_until(lambda: second.value("gpu_exporter_bridge_queue_messages") == 0, 10, "the redelivery handled")
            # the first group's acknowledgement reached the broker: it is not delivered again
            assert second.value("gpu_exporter_bridge_messages_received_total") == 3
            assert stamps(second_rx) == want
        finally:
            second.stop()
            pub.close()


def test_node_liveness_from_retained_status(broker: MosquittoServer, prometheus: PrometheusServer) -> None:
    pub = Publisher(broker.port)
    pub.publish("t/alpha/status", b"online", retain=True)
    pub.publish("t/beta/status", b"offline", retain=True)
    bridge = Running(broker, prometheus.write_url, client_id=f"b-{_node()}")
    try:
        wait_until(
            lambda: (
                bridge.value("gpu_exporter_node_up", node="beta") == 0
                and bridge.value("gpu_exporter_node_up", node="alpha") == 1
                and bridge.value("gpu_exporter_node_last_seen_timestamp_seconds", node="beta") > 0
            ),
            10,
            "retained status seen",
        )
        before = bridge.value("gpu_exporter_node_last_seen_timestamp_seconds", node="alpha")
        pub.publish("t/alpha/status", b"offline", retain=True)
        wait_until(lambda: bridge.value("gpu_exporter_node_up", node="alpha") == 0, 10, "alpha offline")
        assert bridge.value("gpu_exporter_node_last_seen_timestamp_seconds", node="alpha") >= before
    finally:
        pub.close()
        bridge.stop()


def test_mqtt_session_is_persistent_with_manual_ack(broker: MosquittoServer, prometheus: PrometheusServer) -> None:
    bridge = Running(broker, prometheus.write_url, client_id="persist", session_expiry=600, group="g1")
    try:
        assert bridge.bridge.batch_topic == "$share/g1/t/+/batch"
    finally:
        bridge.stop()
    # Messages published while the bridge is away wait in its session.
    pub = Publisher(broker.port)
    node = _node()
    b = make_batch(node, "b", [1, 2], time.time() - 30)
    pub.publish(f"t/{node}/batch", encode(b))
    pub.close()
    again = Running(broker, prometheus.write_url, client_id="persist", session_expiry=600, group="g1")
    try:
        wait_until(lambda: want_in(prometheus, b), 20, "the batch sent while away")
    finally:
        again.stop()
