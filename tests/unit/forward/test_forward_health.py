"""What a health report holds (forward/health.py ``snapshot``) and when one is made (``due``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpu_exporter.forward.health import REPORTED, HealthReports, snapshot
from gpu_exporter.payload import decode


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    dropped = Counter("gpu_exporter_forward_dropped_batches", "d", ["reason"], registry=registry)
    dropped.labels("max_age").inc(3)
    Gauge("gpu_exporter_collect_duration_seconds", "d", registry=registry).set(0.0123456789)
    Gauge("gpu_exporter_last_collect_success_timestamp_seconds", "d", registry=registry).set(1764412800.123456)
    Counter("process_cpu_seconds", "d", registry=registry).inc(12345.6789)
    Gauge("gpu_exporter_http_connections", "not reported", registry=registry).set(4)
    return registry


def test_a_snapshot_names_values_as_the_page_does() -> None:
    values = {(v.name, v.labels): v.value for v in snapshot(_registry())}
    assert values == {
        ("gpu_exporter_forward_dropped_batches_total", (("reason", "max_age"),)): 3.0,  # no _created beside it
        ("gpu_exporter_collect_duration_seconds", ()): 0.01235,  # 4 significant digits (--mqtt.value-digits)
        ("gpu_exporter_last_collect_success_timestamp_seconds", ()): 1764412800.123,  # to the millisecond
        ("process_cpu_seconds_total", ()): 12345.679,  # a counter to the millisecond: it stays monotonic
    }
    exact = {(v.name, v.labels): v.value for v in snapshot(_registry(), digits=0)}
    assert exact[("gpu_exporter_collect_duration_seconds", ())] == 0.0123456789


def test_every_reported_name_is_one_a_page_serves() -> None:
    """Counters by their sample name (``_total``), never a family name the page does not print."""
    for name in REPORTED:
        assert not name.endswith("_created")
        assert name.startswith(("gpu_exporter_", "process_"))


def test_a_report_is_made_each_batch_interval_and_while_summarising_only_with_a_fresh_summary() -> None:
    reports = HealthReports("edge-7", "b" * 32, _registry(), wall=lambda: 1764412830.0)
    assert reports.due(0.0, 2.0, summarising=False, summaries=0)
    reports.make(0.0, summaries=0)
    assert reports.pending is not None and reports.seq == 1
    batch = decode(reports.pending)
    assert batch.first_seq == 1 and batch.samples[0].timestamp == 1764412830.0 and not batch.samples[0].devices
    assert not reports.due(1.9, 2.0, summarising=False, summaries=0)
    assert reports.due(2.0, 2.0, summarising=False, summaries=0)
    reports.make(2.0, summaries=0)
    assert not reports.due(70.0, 2.0, summarising=True, summaries=0)  # no fresh summary since
    assert not reports.due(61.9, 2.0, summarising=True, summaries=1)  # a thin link: every 60 s at most
    assert reports.due(62.0, 2.0, summarising=True, summaries=1)
    reports.make(62.0, summaries=1)
    assert decode(reports.pending).first_seq == 3  # the newest replaces the one not yet sent
    reports.lost()
    assert reports.pending is None
