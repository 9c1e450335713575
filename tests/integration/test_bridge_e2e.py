"""End to end with real processes on 127.0.0.1: the exporter on simulated GPUs forwards over Mosquitto,
the bridge writes to Prometheus (or VictoriaMetrics), and every sample the exporter forwarded is found
with its original timestamp, across a broker outage, an exporter SIGKILL and a bridge SIGKILL."""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import pytest

from tests.support import Exporter
from tests.support.bridge_helpers import BridgeProcess, stored_points
from tests.support.mosquitto import Collector
from tests.support.tsdb import MosquittoServer, PrometheusServer, Server, VictoriaMetricsServer, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "edge-e2e"


def expected(collector: Collector) -> set[tuple[frozenset[tuple[str, str]], int, float]]:
    """What the exporter forwarded, as (labels, ms, value), computed from the decoded batches."""
    from gpu_exporter import catalog

    out = set()
    for batch in list(collector.batches):
        for p in batch.points():
            metric = catalog.by_key(p.key)
            labels = {
                "__name__": metric.name,
                "node": batch.node,
                **dict(p.device.labels()),
                **dict(metric.const_labels),
            }
            labels.update(zip(metric.labels, p.labels, strict=True))
            out.add((frozenset(labels.items()), p.timestamp_ms, p.value))
    return out


@pytest.mark.parametrize("receiver", ["prometheus", "victoria-metrics"])
def test_every_forwarded_sample_lands_across_outage_and_kills(receiver: str, tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    tsdb: Server = (
        PrometheusServer(tmp_path / "prom", ooo_window="2h")
        if receiver == "prometheus"
        else VictoriaMetricsServer(tmp_path / "vm")
    )
    broker.start()
    tsdb.start()
    write_url = tsdb.write_url  # type: ignore[attr-defined]
    exporter_args = (
        "--gpu-vendor=fake",
        "--fake.gpus=2",
        "--gpu-metrics-collection-interval=200ms",
        f"--node-name={NODE}",
        f"--mqtt.url={broker.url}",
        f"--spool.dir={tmp_path / 'spool'}",
        "--mqtt.batch-interval=500ms",
        "--mqtt.reconnect-max-delay=500ms",
    )
    bridge = BridgeProcess(tmp_path, broker, write_url, "e2e-bridge")
    exporters: list[Exporter] = []
    try:
        with Collector(broker) as collector:
            bridge.start()
            exporters.append(Exporter(*exporter_args).start())
            wait_until(lambda: collector.count() >= 10, 20, "first batches")

            # 1. broker outage: the exporter spools, the bridge reconnects to its persistent session
            broker.stop()
            time.sleep(2.0)
            broker.start()
            before = collector.count()
            wait_until(lambda: collector.count() >= before + 10, 30, "batches after the outage")

            # 2. exporter SIGKILL and restart (a new boot; the spool of the old one is sent)
            exporters[-1].stop(signal.SIGKILL)
            exporters.append(Exporter(*exporter_args).start())
            wait_until(lambda: len(collector.seqs()) == 2, 30, "batches of the second boot")

            # 3. bridge SIGKILL mid-stream: what it had not acknowledged is delivered again
            bridge.stop(signal.SIGKILL)
            time.sleep(1.5)
            bridge.start()
            before = collector.count()
            wait_until(lambda: collector.count() >= before + 10, 30, "batches after the bridge restart")

            exporters[-1].stop(signal.SIGTERM)  # a clean stop flushes the open batch
            time.sleep(1.0)
            want = expected(collector)
            assert len(want) > 1000

            selector = f'{{node="{NODE}",__name__=~"gpu_.+"}}'
            missing: set[tuple[frozenset[tuple[str, str]], int, float]] = set()

            def landed() -> bool:
                missing.clear()
                stored = stored_points(tsdb.samples(selector))  # type: ignore[attr-defined]
                missing.update(want - stored)
                if missing and receiver == "victoria-metrics":
                    # VictoriaMetrics keeps about 12 significant decimal digits of a value
                    by_key = {(labels, t): v for labels, t, v in stored}
                    missing.difference_update(
                        p for p in list(missing) if math.isclose(by_key.get(p[:2], math.inf), p[2], rel_tol=1e-11)
                    )
                return not missing

            try:
                wait_until(landed, 60, "every forwarded sample in the receiver", interval=1.0)
            except TimeoutError:
                stamps = sorted({t for _, t, _ in missing})
                names = sorted({dict(labels)["__name__"] for labels, _, _ in missing})
                raise AssertionError(
                    f"{len(missing)} of {len(want)} samples missing, {len(stamps)} timestamps "
                    f"{stamps[:3]}..{stamps[-3:]}, metrics {names[:5]}; bridge log:\n{bridge.log.read_text()[-3000:]}"
                ) from None

            # every boot forwarded a gap-free run of samples from seq 1
            boots = collector.seqs()
            assert len(boots) == 2
            for seqs in boots.values():
                assert seqs == set(range(1, max(seqs) + 1))
            assert bridge.metric("gpu_exporter_bridge_gpu_samples_written_total") > 0
    finally:
        for exp in exporters:
            if exp.proc is not None and exp.proc.poll() is None:
                exp.stop(signal.SIGKILL)
        bridge.stop(signal.SIGKILL)
        tsdb.stop()
        broker.stop()
