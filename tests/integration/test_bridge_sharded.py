"""Past one TSDB: agents -> Mosquitto -> bridge -> vmagent -> two VictoriaMetrics shards, real processes
on 127.0.0.1. vmagent splits the series by node (bench/fleet_shards.py: per-URL relabeling, hashmod of
the node label), and every sample every agent forwarded is stored exactly once: in its node's shard,
never in both, none missing."""

from __future__ import annotations

import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support import Exporter, paths, wait_until
from tests.support.bridge_helpers import BridgeProcess
from tests.support.mosquitto import Collector
from tests.support.tsdb import MosquittoServer

sys.path.insert(0, str(paths.ROOT / "bench"))
from fleet_shards import Sharded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODES = ["edge-a", "edge-b", "edge-c", "edge-d"]


def test_every_sample_lands_once_across_two_shards(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    tsdb = Sharded(tmp_path / "tsdb", shards=2)
    broker.start()
    tsdb.start()
    bridge = BridgeProcess(tmp_path, broker, tsdb.write_url, "sharded-bridge")
    exporters: list[Exporter] = []
    try:
        with Collector(broker) as collector:
            bridge.start()
            for node in NODES:
                exporters.append(
                    Exporter(
                        "--gpu-vendor=fake",
                        "--fake.gpus=1",
                        "--gpu-metrics-collection-interval=250ms",
                        f"--node-name={node}",
                        f"--mqtt.url={broker.url}",
                        f"--spool.dir={tmp_path / ('spool-' + node)}",
                        "--mqtt.batch-interval=500ms",
                    ).start()
                )
            wait_until(lambda: collector.count() >= 80, 40, "80 samples from the agents")
            for e in exporters:
                e.stop(signal.SIGTERM)  # a clean stop publishes the open batch
            exporters.clear()
            time.sleep(1.0)
            want: dict[str, Counter[int]] = {}
            for batch in list(collector.batches):
                stamps = {p.timestamp_ms for p in batch.points()}  # one gpu_up per sample of the one GPU
                want.setdefault(batch.node, Counter()).update(stamps)
            assert sorted(want) == NODES
            start = min(min(c) for c in want.values()) - 1000

            def stored() -> list[dict[str, Counter[int]]]:
                per_shard = []
                for vm in tsdb.shards:
                    urlopen_flush(vm.url)
                    held: dict[str, Counter[int]] = {}
                    for labels, stamps in vm.export('gpu_up{gpu="0"}', start):
                        held.setdefault(labels["node"], Counter()).update(stamps)
                    per_shard.append(held)
                return per_shard

            def all_there() -> bool:
                shards = stored()
                return all(sum((s.get(n, Counter()) for s in shards), Counter()) == want[n] for n in NODES)

            try:
                wait_until(all_there, 60, "every sample in one of the shards", interval=1.0)
            except TimeoutError:
                pass
            shards = stored()
            for node in NODES:
                holding = [i for i, s in enumerate(shards) if node in s]
                assert len(holding) == 1, f"{node} in shards {holding}"
                got = shards[holding[0]][node]
                lost = want[node] - got
                twice = got - want[node]
                assert not lost and not twice, f"{node}: {sum(lost.values())} lost, {sum(twice.values())} twice"
            assert all(shards), f"a shard got nothing: {[sorted(s) for s in shards]}"
    finally:
        for e in exporters:
            e.stop()
        bridge.stop()
        tsdb.stop()
        broker.stop()


def urlopen_flush(url: str) -> None:
    """Make what a shard took searchable now (VictoriaMetrics flushes every second or so by itself)."""
    import urllib.request

    with urllib.request.urlopen(url + "/internal/force_flush", timeout=10) as resp:
        resp.read()
