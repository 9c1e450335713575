"""Health reports through the bridge's real writer path (``Bridge.process``) to a receiver that records
every request: the agent's own metrics land under its page's names with the node label, at the report's
time; names the bridge keeps for itself, or for GPU series, are refused; repeats are dropped; batches of
the same boot are not mistaken for repeats of a report."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.model import Sample
from gpu_exporter.payload import Batch, HealthValue, encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch

NODE = "edge-7"
BOOT = "b" * 32


def _ok(n: int) -> tuple[int, bytes, dict[str, str]]:
    return 204, b"", {}


def _bridge(url: str) -> tuple[Bridge, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=url, rw_backoff_max=0.05)
    return Bridge(settings, registry), registry


def _report(seq: int, t: float, *values: HealthValue) -> Received:
    batch = Batch(NODE, BOOT, (Sample(seq, t, ()),), health=values)
    return Received(seq, 1, f"gpu-exporter/{NODE}/batch", encode(batch), None)


def _written(rx: ScriptedReceiver) -> dict[frozenset[tuple[str, str]], list[tuple[int, float]]]:
    out: dict[frozenset[tuple[str, str]], list[tuple[int, float]]] = {}
    for request in rx.requests:
        for labels, points in request.series:
            out.setdefault(frozenset(labels), []).extend(points)
    return out


def test_a_report_lands_under_the_pages_names_with_the_node_label() -> None:
    now = time.time() - 5
    values = (
        HealthValue("gpu_exporter_collect_duration_seconds", (), 0.012),
        HealthValue("gpu_exporter_forward_dropped_batches_total", (("reason", "max_age"),), 4.0),
        HealthValue("gpu_exporter_build_info", (("revision", ""), ("version", "0.1.0")), 1.0),
    )
    with ScriptedReceiver(_ok) as rx:
        bridge, _ = _bridge(rx.url)
        assert bridge.process([_report(1, now, *values)]) == 3
    stamp = round(now * 1000)
    assert _written(rx) == {
        frozenset({("__name__", "gpu_exporter_collect_duration_seconds"), ("node", NODE)}): [(stamp, 0.012)],
        frozenset(
            {("__name__", "gpu_exporter_forward_dropped_batches_total"), ("reason", "max_age"), ("node", NODE)}
        ): [(stamp, 4.0)],
        # an empty label value is no label (as Prometheus reads it)
        frozenset({("__name__", "gpu_exporter_build_info"), ("version", "0.1.0"), ("node", NODE)}): [(stamp, 1.0)],
    }


def test_names_not_the_agents_own_are_refused_and_counted() -> None:
    now = time.time() - 5
    values = (
        HealthValue("gpu_utilization_ratio", (("gpu", "0"),), 1.0),  # a GPU series: only batches bring those
        HealthValue("gpu_exporter_node_up", (), 1.0),  # the bridge's own view of the node
        HealthValue("gpu_exporter_bridge_samples_total", (), 1.0),
        HealthValue("up", (), 1.0),
        HealthValue("gpu_exporter_collects_total", (("node", "someone-else"),), 1.0),
        HealthValue("process_cpu_seconds_total", (), 2.5),
    )
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url)
        assert bridge.process([_report(1, now, *values)]) == 1
    assert list(_written(rx)) == [frozenset({("__name__", "process_cpu_seconds_total"), ("node", NODE)})]
    dropped = "gpu_exporter_bridge_values_dropped_total"
    assert registry.get_sample_value(dropped, {"node": NODE, "reason": "health_name"}) == 4
    assert registry.get_sample_value(dropped, {"node": NODE, "reason": "health_label"}) == 1


def test_a_repeated_report_is_dropped_and_batches_of_the_boot_are_not_repeats_of_it() -> None:
    now = time.time() - 20
    value = HealthValue("gpu_exporter_forward_spool_batches", (), 3.0)
    batch = make_batch(NODE, BOOT, [1, 2, 3], now)  # samples 1-3 of the same boot
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = _bridge(rx.url)
        assert bridge.process([_report(1, now + 10, value)]) == 1
        assert bridge.process([_report(1, now + 10, value)]) == 0  # the same report again (a lost PUBACK)
        assert bridge.process([Received(9, 1, f"gpu-exporter/{NODE}/batch", encode(batch), None)]) > 0
        assert bridge.process([_report(2, now + 12, value)]) == 1
    points = _written(rx)[frozenset({("__name__", "gpu_exporter_forward_spool_batches"), ("node", NODE)})]
    assert [t for t, _ in points] == [round((now + 10) * 1000), round((now + 12) * 1000)]
    assert registry.get_sample_value("gpu_exporter_bridge_duplicate_samples_total") == 1
