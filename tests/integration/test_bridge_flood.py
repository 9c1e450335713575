"""Series floods against the real bridge process, through Mosquitto into a real Prometheus. Issue 13's:
twenty valid messages from one node carrying a million distinct series in all, then a healthy node's
batch. Issue 20's, CI-sized: a flood spread over invented node names.

The bound asserted is the design's: --bridge.max-series-per-node (default 10,000) caps what one node
creates, so neither Prometheus nor the bridge's caches hold the million; the bridge decodes at most
--bridge.max-payload of inflated JSON per write group. Its peak RSS (VmHWM, read from /proc) must stay
within 512 MiB with margin: well inside the manifest's 1280Mi (deploy/bridge.yaml), which is sized for a flood
that fills the whole fleet budget (tests/deploy/test_bridge_deploy.py). The figures are printed (-s).
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, encode
from tests.support import wait_progressing
from tests.support.bridge_attacks import series_flood
from tests.support.bridge_helpers import BridgeProcess, Publisher, expected_points, make_batch, stored_points
from tests.support.tsdb import MosquittoServer, PrometheusServer, http_get, wait_until

# the flood is a fixed amount of work, waited for while it progresses; this only guards against a hang
# xdist_group: never at the same time as the time-scaled weak-link tests (a minute of both cores)
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200), pytest.mark.xdist_group("heavy")]

MESSAGES = 20
SERIES = 1_000_000
DEVICES = 10
FLOOD_LIMIT = 512 * 1024 * 1024  # a few nodes' flood: far below the fleet budget the manifest is sized for
PER_NODE = cfg.Config().bridge_max_series_per_node  # the default
# what moves while the bridge works through the flood
_PROGRESS = (
    "messages_received_total",
    "queue_messages",
    "samples_written_total",
    'write_requests_total{code="204"}',
    'series_limited_total{node="edge-flood",reason="node"}',
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
        limited = bridge.metric('gpu_exporter_bridge_series_limited_total{node="edge-flood",reason="node"}')
        print(f"series of the flooding node in Prometheus: {flood_series}; values dropped by the limit: {limited:.0f}")
        assert flood_series <= PER_NODE
        assert limited >= SERIES - PER_NODE
        assert peak < FLOOD_LIMIT * 0.75, f"bridge peak RSS {peak / 2**20:.0f} MiB"
    finally:
        if pub is not None:
            pub.close()
        bridge.stop(signal.SIGKILL)
        prom.stop()
        broker.stop()


def test_a_flood_spread_over_node_names_is_capped_by_new_names_and_the_fleet_budget(tmp_path: Path) -> None:
    """Issue 20: the per-node cap no longer multiplies with the names a publisher invents. Names without
    a retained status, after the bridge subscribed, get in three at once and then at 3 a minute; the
    others wait, unacknowledged, within half the in-flight account (here 2 messages of 4; a third is
    dropped and counted); together the admitted ones stop at the fleet's budget."""
    broker = MosquittoServer(tmp_path / "mqtt")
    prom = PrometheusServer(tmp_path / "prom", ooo_window="2h")
    broker.start()
    prom.start()
    limits = (
        "--bridge.max-series-per-node=2000",
        "--bridge.max-series=5000",
        "--bridge.new-nodes-per-minute=3",
        "--bridge.new-nodes-burst=3",
        "--bridge.max-inflight=4",
    )
    bridge = BridgeProcess(tmp_path, broker, prom.write_url, "spread-bridge", *limits)
    names = [f"edge-spread-{i}" for i in range(8)]
    messages = series_flood(names, 8 * 4999, time.time() - 60, devices=1)  # 5000 series each with gpu_up
    pub = None
    try:
        bridge.start()
        assert bridge.proc is not None
        base = _peak_rss(bridge.proc.pid)
        pub = Publisher(broker.port, client_id="spreader")
        for topic, payload in messages:
            pub.publish(topic, payload)
        wait_until(
            lambda: (
                bridge.metric("gpu_exporter_bridge_messages_received_total") == len(messages)
                and bridge.metric("gpu_exporter_bridge_queue_messages") == 2  # the two that wait
            ),
            120,
            "every message",
            interval=0.5,
        )
        peak = _peak_rss(bridge.proc.pid)
        head = json.loads(http_get(f"{prom.url}/api/v1/status/tsdb", 60))["data"]["headStats"]
        print(f"\nspread: peak RSS {peak / 2**20:.0f} MiB (from {base / 2**20:.0f}), {head['numSeries']} series")
        assert int(head["numSeries"]) == 5000
        assert bridge.metric("gpu_exporter_bridge_new_nodes_total") == 3
        assert bridge.metric("gpu_exporter_bridge_held_back_messages") == 2
        assert bridge.metric("gpu_exporter_bridge_new_nodes_refused_total") == 3
        assert bridge.metric("gpu_exporter_bridge_active_series") == 5000
        limited = [
            bridge.metric(f'gpu_exporter_bridge_series_limited_total{{node="{n}",reason="{why}"}}')
            for n in names[:3]
            for why in ("node", "fleet")
        ]
        assert limited == [3000, 0, 3000, 0, 0, 4000]
        assert peak - base < 64 * 2**20
    finally:
        if pub is not None:
            pub.close()
        bridge.stop(signal.SIGKILL)
        prom.stop()
        broker.stop()
