"""Issue 13's done-when, with real processes: a node 400 days ahead and a node an hour behind (real
exporters with libfaketime preloaded, monotonic clock untouched) forward at the same time as a healthy node
through one Mosquitto and one bridge into a real Prometheus, which also scrapes the bridge.

Every healthy sample lands with its own timestamp; Prometheus's newest sample is not in the future;
the skewed nodes' samples are corrected (counted) to about when they were taken; the skew metric shows
both offsets and the PrometheusRule's GPUEdgeClockSkew expression returns exactly those two nodes.
"""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.test_bridge_e2e import expected
from tests.support import Exporter, child_env, paths
from tests.support.bridge_helpers import BridgeProcess, stored_points
from tests.support.faketime import faketime_env, libfaketime
from tests.support.mosquitto import Collector
from tests.support.tsdb import MosquittoServer, PrometheusServer, http_get, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LIBFAKETIME = libfaketime()
RULES = paths.ROOT / "deploy" / "prometheusrule.yaml"
DAY = 86400


class SkewedExporter(Exporter):
    """The exporter with its wall clock shifted by libfaketime (``offset`` such as "+400d"), preloaded
    into the exporter itself (tests/support/faketime.py): the PID the test signals is the exporter's."""

    def __init__(self, offset: str, library: str, *args: str) -> None:
        super().__init__(*args, env=faketime_env(child_env(), offset, library))
        self.offset = offset


def _alert_expr(name: str) -> str:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    for group in doc["spec"]["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                return str(rule["expr"])
    raise AssertionError(f"no alert {name} in {RULES}")


def test_skewed_nodes_cannot_blind_the_fleet(tmp_path: Path) -> None:
    if LIBFAKETIME is None:
        pytest.skip("libfaketime is not installed (apt-get install faketime; .ci/run installs it)")
    broker = MosquittoServer(tmp_path / "mqtt")
    prom = PrometheusServer(tmp_path / "prom", ooo_window="2h")
    bridge = BridgeProcess(tmp_path, broker, prom.write_url, "clock-bridge")
    (prom.workdir / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n"
        "storage:\n  tsdb:\n    out_of_order_time_window: 2h\n"
        f"scrape_configs:\n  - job_name: bridge\n    static_configs:\n      - targets: ['127.0.0.1:{bridge.port}']\n"
    )
    broker.start()
    prom.start()
    started = time.time()

    def args(node: str) -> tuple[str, ...]:
        return (
            "--gpu-vendor=fake",
            "--fake.gpus=2",
            "--gpu-metrics-collection-interval=200ms",
            f"--node-name={node}",
            f"--mqtt.url={broker.url}",
            f"--spool.dir={tmp_path / ('spool-' + node)}",
            "--mqtt.batch-interval=500ms",
        )

    exporters: list[Exporter] = []
    try:
        with Collector(broker) as collector:
            bridge.start()
            exporters.append(SkewedExporter("+400d", LIBFAKETIME, *args("edge-ahead")).start())
            exporters.append(SkewedExporter("-1h", LIBFAKETIME, *args("edge-behind")).start())
            exporters.append(Exporter(*args("edge-healthy")).start())
            wait_until(
                lambda: (
                    {b.node for b in collector.batches} >= {"edge-ahead", "edge-behind", "edge-healthy"}
                    and collector.count() >= 30
                ),
                30,
                "batches from all three nodes",
            )
            time.sleep(3.0)  # all three keep forwarding side by side
            for exp in exporters:
                # a clean stop flushes the open batch: the exporter itself gets the signal and exits 0
                # after its last step ("stopped"), within the time the kubelet would give it
                code = exp.stop(signal.SIGTERM, timeout=20)
                out = exp.output()
                last = (out.strip().splitlines() or [""])[-1]
                assert code == 0 and re.search(r"\bstopped\b", last), f"exit {code}: {out[-2000:]}"
            time.sleep(1.5)
            ended = time.time()

            # the skewed agents really stamped their samples 400 days ahead and an hour behind
            newest = {b.node: max(s.timestamp for s in b.samples) for b in list(collector.batches)}
            assert newest["edge-ahead"] > ended + 399 * DAY
            assert ended - 3700 < newest["edge-behind"] < ended - 3500

            # 1. every sample of the healthy node lands, with its own timestamp
            want = {p for p in expected(collector) if ("node", "edge-healthy") in p[0]}
            assert len(want) > 500
            selector = '{node="edge-healthy",__name__=~"gpu_.+"}'
            missing: set[tuple[frozenset[tuple[str, str]], int, float]] = set()

            def landed() -> bool:
                missing.clear()
                missing.update(want - stored_points(prom.samples(selector)))
                return not missing

            try:
                wait_until(landed, 60, "every healthy sample in Prometheus", interval=1.0)
            except TimeoutError:
                raise AssertionError(
                    f"{len(missing)} of {len(want)} healthy samples missing; bridge log:\n"
                    f"{bridge.log.read_text()[-3000:]}"
                ) from None

            # 2. nothing in Prometheus is stamped after the bridge's (this machine's) clock
            status = json.loads(http_get(f"{prom.url}/api/v1/status/tsdb"))["data"]["headStats"]
            assert int(status["maxTime"]) <= time.time() * 1000

            # 3. the skewed nodes' samples were corrected to about when they were taken, and counted
            for node in ("edge-ahead", "edge-behind"):
                stamps = [
                    t for points in prom.samples(f'{{node="{node}",__name__="gpu_up"}}').values() for t, _ in points
                ]
                assert stamps, f"no samples of {node}"
                # (a correction is off by the unseen network transit, which makes a sample late, never early)
                assert (started - 10) * 1000 <= min(stamps) and max(stamps) <= time.time() * 1000
                assert bridge.metric(f'gpu_exporter_bridge_edge_samples_corrected_total{{node="{node}"}}') > 0
            assert bridge.metric('gpu_exporter_bridge_edge_samples_corrected_total{node="edge-healthy"}') == 0

            # 4. the skew metric, and the alert's expression over what Prometheus scraped from the bridge
            skew = {n: bridge.metric(f'gpu_exporter_node_clock_skew_seconds{{node="{n}"}}') for n in newest}
            assert skew["edge-ahead"] == pytest.approx(400 * DAY, abs=5)
            assert skew["edge-behind"] == pytest.approx(-3600, abs=5)
            assert abs(skew["edge-healthy"]) < 2
            expr = _alert_expr("GPUEdgeClockSkew")
            firing: set[str] = set()

            def alert_would_fire() -> bool:
                firing.clear()
                firing.update(item["metric"]["node"] for item in prom.query(expr)["result"])
                return bool(firing)

            wait_until(alert_would_fire, 20, "the skew alert's expression over scraped bridge metrics", 1.0)
            assert firing == {"edge-ahead", "edge-behind"}
    finally:
        for exp in exporters:
            if exp.proc is not None and exp.proc.poll() is None:
                exp.stop(signal.SIGKILL)
        bridge.stop(signal.SIGKILL)
        prom.stop()
        broker.stop()
