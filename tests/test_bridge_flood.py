"""Issue 13's series flood against the real bridge process: twenty valid messages from one node carrying
a million distinct series in all, then a healthy node's batch, through Mosquitto into a real Prometheus.

The bound asserted is the design's: --bridge.max-series-per-node (default 20,000) caps what one node
creates, so neither Prometheus nor the bridge's caches hold the million; the bridge decodes at most
--bridge.max-payload of inflated JSON per write group. Its peak RSS (VmHWM, read from /proc) must stay
within the manifest's 512Mi limit (deploy/bridge.yaml) with margin. The figures are printed (-s).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from gpu_exporter.forward.batch import Batch, encode
from gpu_exporter.model import DeviceId, DeviceSample, Sample

from .bridge_helpers import BridgeProcess, Publisher, expected_points, make_batch, stored_points
from .conftest import wait_progressing
from .tsdb import MosquittoServer, PrometheusServer, http_get, wait_until

# the flood is a fixed amount of work, waited for while it progresses; this only guards against a hang
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

MESSAGES = 20
SERIES = 1_000_000
DEVICES = 10
MANIFEST_LIMIT = 512 * 1024 * 1024
PER_NODE = 20_000  # --bridge.max-series-per-node's default
# what moves while the bridge works through the flood
_PROGRESS = (
    "messages_received_total",
    "queue_messages",
    "samples_written_total",
    'write_requests_total{code="204"}',
    'series_limited_total{node="edge-flood"}',
)


def flood_payloads(node: str, t: float) -> list[bytes]:
    """Twenty one-sample batches; each device carries its own XID series, all distinct across batches."""
    per_device = SERIES // MESSAGES // DEVICES
    out = []
    for m in range(MESSAGES):
        devices = []
        for d in range(DEVICES):
            base = (m * DEVICES + d) * per_device
            values = {("xid_errors", (str(base + i),)): 1.0 for i in range(per_device)}
            devices.append(DeviceSample(DeviceId(str(d), f"GPU-{node}-{d}"), True, values, {}))
        out.append(encode(Batch(node, "boot-1", (Sample(m + 1, t + m * 0.1, tuple(devices)),))))
    return out


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def test_series_flood_is_capped_per_node_and_the_bridge_stays_within_its_memory_limit(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    prom = PrometheusServer(tmp_path / "prom", ooo_window="2h")
    broker.start()
    prom.start()
    bridge = BridgeProcess(tmp_path, broker, prom.write_url, "flood-bridge")
    now = time.time()
    payloads = flood_payloads("edge-flood", now - 60)
    healthy = make_batch("edge-healthy", "boot-1", list(range(1, 11)), now - 50)
    pub = None
    try:
        bridge.start()
        assert bridge.proc is not None
        pub = Publisher(broker.port, client_id="flooder")
        for payload in payloads:
            pub.publish("gpu-exporter/edge-flood/batch", payload)
        pub.publish("gpu-exporter/edge-healthy/batch", encode(healthy))
        # a fixed amount of work at the machine's speed: wait as long as the bridge gets on with it
        wait_progressing(
            lambda: (
                bridge.metric("gpu_exporter_bridge_messages_received_total") == MESSAGES + 1
                and bridge.metric("gpu_exporter_bridge_queue_messages") == 0
            ),
            lambda: [bridge.metric(f"gpu_exporter_bridge_{m}") for m in _PROGRESS],
            120,
            "the bridge to write every message",
        )
        peak = _peak_rss(bridge.proc.pid)
        print(f"\nflood: {MESSAGES} messages, {SERIES} distinct series ({sum(map(len, payloads))} bytes compressed)")
        print(f"bridge peak RSS (VmHWM): {peak / 2**20:.0f} MiB")

        # the healthy node's samples all land
        want = expected_points(healthy)
        wait_until(
            lambda: want <= stored_points(prom.samples('{node="edge-healthy",__name__=~"gpu_.+"}')),
            60,
            "the healthy node's samples",
        )
        healthy_series = len(prom.samples('{node="edge-healthy"}'))
        head = json.loads(http_get(f"{prom.url}/api/v1/status/tsdb", 60))["data"]["headStats"]
        flood_series = int(head["numSeries"]) - healthy_series  # no query over a million series
        limited = bridge.metric('gpu_exporter_bridge_series_limited_total{node="edge-flood"}')
        print(f"series of the flooding node in Prometheus: {flood_series}; values dropped by the limit: {limited:.0f}")
        assert flood_series <= PER_NODE
        assert limited >= SERIES - PER_NODE
        assert peak < MANIFEST_LIMIT * 0.75, f"bridge peak RSS {peak / 2**20:.0f} MiB"
    finally:
        if pub is not None:
            pub.close()
        bridge.stop(signal.SIGKILL)
        prom.stop()
        broker.stop()
