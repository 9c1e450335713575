"""A wait the bridge cannot see is not clock skew (bridge/clock.py, bridge/inflight.py): the in-flight
account says how long a message read now may have waited since the broker stamped it, and the clock
guard takes the skew closest to zero that this allows. The bridge's real decode, clock and write path
runs against a receiver that records every request; the account's waits are real (threads, real time)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge import inflight
from gpu_exporter.bridge.clock import Stamp
from gpu_exporter.bridge.inflight import Inflight
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch

pytestmark = pytest.mark.timeout(60)


@dataclass
class _Msg:
    mid: int
    qos: int = 1
    payload: bytes = b"x"


def test_the_account_counts_a_backlog_from_its_first_wait_until_paho_keeps_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inflight, "SETTLE_S", 0.5)
    account = Inflight(1, 1 << 20, threading.Event())
    assert account.admit(_Msg(1), False)
    assert account.unseen() == 0.0  # no wait yet: nothing read now waited unseen
    start = time.monotonic()
    second = threading.Thread(target=account.admit, args=(_Msg(2), False))
    second.start()  # paho's thread, held at the bound
    time.sleep(0.4)
    assert 0.3 < account.unseen() <= time.monotonic() - start
    account.release([_Msg(1)])
    second.join(5)
    time.sleep(0.2)  # within SETTLE_S of the last wait: still a backlog, and it goes on counting from its start
    assert account.unseen() >= 0.6
    time.sleep(0.5)  # SETTLE_S without a wait: the socket has drained
    assert account.unseen() == 0.0


def _write(node: str, stamp: Stamp, t0: float) -> tuple[list[int], CollectorRegistry]:
    batch = make_batch(node, "boot-1", [1, 2], t0, gpus=1)
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        registry = CollectorRegistry()
        settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=rx.url, max_clock_skew=300.0)
        Bridge(settings, registry).process([Received(1, 1, f"gpu-exporter/{node}/batch", encode(batch), stamp)])
    stamps = sorted(
        {t for req in rx.requests for labels, points in req.series if ("node", node) in labels for t, _ in points}
    )
    return stamps, registry


def test_a_batch_that_waited_unseen_longer_than_the_limit_keeps_its_timestamps() -> None:
    """The bench's backlog: a right clock, a batch read 590 s after it was sent, the broker's hold time 0,
    the bridge's account held for 600 s."""
    now = time.time()
    node = "edge-backlogged"
    stamp = Stamp(round(now * 1000), round((now - 590) * 1000), 0, 600_000)
    stamps, registry = _write(node, stamp, now - 600)
    assert stamps == [round((now - 600) * 1000), round((now - 595) * 1000)]
    assert not registry.get_sample_value("gpu_exporter_bridge_edge_samples_corrected_total", {"node": node})
    assert registry.get_sample_value("gpu_exporter_node_clock_skew_seconds", {"node": node}) == 0.0


def test_a_clock_behind_by_more_than_the_wait_is_still_corrected_by_what_the_wait_cannot_explain() -> None:
    now = time.time()
    node = "edge-an-hour-behind"
    # an hour behind, read 10 s after sending, in a backlog that began 20 s ago
    stamp = Stamp(round(now * 1000), round((now - 3610) * 1000), 0, 20_000)
    stamps, registry = _write(node, stamp, now - 3600 - 20)
    assert registry.get_sample_value("gpu_exporter_node_clock_skew_seconds", {"node": node}) == -3590.0
    assert registry.get_sample_value("gpu_exporter_bridge_edge_samples_corrected_total", {"node": node}) == 2
    assert stamps == [round((now - 30) * 1000), round((now - 25) * 1000)]  # moved forward by 3,590 s, not more


def test_the_estimate_is_the_skew_closest_to_zero_the_wait_allows() -> None:
    assert Stamp(10_000, 4_000, 0, 0).estimate_ms == -6_000  # no backlog: as measured
    assert Stamp(10_000, 4_000, 0, 2_500).estimate_ms == -3_500
    assert Stamp(10_000, 4_000, 0, 9_000).estimate_ms == 0
    assert Stamp(10_000, 13_000, 0, 9_000).estimate_ms == 3_000  # ahead: a wait never explains a lead
    assert Stamp(10_000).estimate_ms is None
