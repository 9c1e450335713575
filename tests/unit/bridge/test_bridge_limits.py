"""Bounds no node name, and no number of names, gets past (issue 20): the fleet-wide series budget and
its window, new node names per minute after the fleet introduced itself, twin agents under one name, and
one log line per kind of trouble a minute. The bridge's writer path runs with a clock the test moves."""

from __future__ import annotations

import logging
import time

import pytest

from gpu_exporter.bridge.limits import QUIET, SERIES_WINDOW
from gpu_exporter.bridge.service import Received
from gpu_exporter.bridge.twins import LIVE
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch
from tests.support.bridge_attacks import local_bridge, message, value
from tests.support.bridge_helpers import ScriptedReceiver, make_batch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ok(n: int) -> tuple[int, bytes, dict[str, str]]:
    return 204, b"", {}


def _wide(node: str, series: int, t: float, seq: int = 1, boot: str = "b1", first: int = 0) -> Batch:
    """One sample of one GPU with ``series`` - 1 XID series (plus its gpu_up): ``series`` series."""
    values = {("xid_errors", (str(first + i),)): 1.0 for i in range(series - 1)}
    device = DeviceSample(DeviceId("0", f"GPU-{node}"), True, values, {})
    return Batch(node, boot, (Sample(seq, t, (device,)),))


def _series(rx: ScriptedReceiver, node: str) -> set[tuple[tuple[str, str], ...]]:
    return {tuple(labels) for r in rx.requests for labels, _ in r.series if ("node", node) in labels}


def test_the_fleet_budget_caps_every_node_together_and_frees_what_went_quiet() -> None:
    clock = Clock()
    t = time.time() - 100
    limited = "gpu_exporter_bridge_series_limited_total"
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url, max_series_per_node=30, max_series=50, clock=clock)
        bridge.process([message(_wide("edge-a", 40, t), 1)])
        bridge.process([message(_wide("edge-b", 40, t), 2)])
        assert (len(_series(rx, "edge-a")), len(_series(rx, "edge-b"))) == (30, 20)
        assert value(registry, limited, node="edge-a", reason="node") == 10
        assert value(registry, limited, node="edge-b", reason="fleet") == 20
        assert value(registry, "gpu_exporter_bridge_active_series") == 50
        # edge-a keeps writing across a window; edge-b goes quiet for two and gives its share back
        clock.now += SERIES_WINDOW + 1
        bridge.process([message(_wide("edge-a", 40, t + 1, seq=2), 3)])
        clock.now += SERIES_WINDOW + 1
        bridge.process([message(_wide("edge-a", 40, t + 2, seq=3), 4)])
        assert value(registry, "gpu_exporter_bridge_active_series") == 30
        bridge.process([message(_wide("edge-c", 40, t), 5)])
    assert len(_series(rx, "edge-c")) == 20
    assert value(registry, limited, node="edge-c", reason="fleet") == 20
    assert value(registry, limited, node="edge-a", reason="fleet") == 0


def test_a_node_whose_series_change_holds_no_more_than_its_cap_until_the_old_ones_go_quiet() -> None:
    """Series stay active for one to two windows after their last value: a node whose XIDs (or pods)
    change cannot hold twice its cap by rotating label values across a window turn."""
    clock = Clock()
    t = time.time() - 100
    limited = "gpu_exporter_bridge_series_limited_total"
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url, max_series_per_node=30, max_series=1000, clock=clock)
        bridge.process([message(_wide("edge-a", 30, t), 1)])  # XIDs 0-28 and gpu_up: at the cap
        clock.now += SERIES_WINDOW + 1
        bridge.process([message(_wide("edge-a", 30, t + 1, seq=2, first=100), 2)])  # XIDs 100-128 instead
        assert value(registry, "gpu_exporter_bridge_active_series") == 30
        assert value(registry, limited, node="edge-a", reason="node") == 29
        assert len(_series(rx, "edge-a")) == 30  # the new XIDs were not written
        clock.now += SERIES_WINDOW + 1  # XIDs 0-28 had no value for a whole window: gone
        bridge.process([message(_wide("edge-a", 30, t + 2, seq=3, first=100), 3)])
        assert value(registry, "gpu_exporter_bridge_active_series") == 30
    assert len(_series(rx, "edge-a")) == 59  # 29 old XIDs, gpu_up, then 29 new ones
    assert value(registry, limited, node="edge-a", reason="node") == 29


def _nodes_written(rx: ScriptedReceiver) -> list[tuple[str, int]]:
    """(node, timestamp ms) of every gpu_up point written, in the order written."""
    return [
        (dict(labels)["node"], ts)
        for r in rx.requests
        for labels, points in r.series
        if dict(labels).get("__name__") == "gpu_up" and dict(labels).get("gpu") == "0"
        for ts, _ in points
    ]


def test_new_node_names_past_the_burst_wait_unacknowledged_and_are_written_as_tokens_come(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    t = time.time() - 100
    held = "gpu_exporter_bridge_held_back_messages"
    with ScriptedReceiver(_ok) as rx, caplog.at_level(logging.WARNING):
        bridge, registry = local_bridge(rx.url, new_nodes_per_minute=3, new_nodes_burst=3, clock=clock)
        # a restarted bridge: its session's backlog comes first, from any number of nodes
        for i in range(5):
            bridge.process([message(make_batch(f"edge-backlog-{i}", "b", [1], t), i + 1)])
        bridge.new_nodes.subscribed()
        # then the retained status messages introduce the fleet, and its nodes' batches follow
        for i in range(10):
            clock.now += 1
            bridge.status(f"gpu-exporter/edge-known-{i}/status", b"online")
        for i in range(10):
            bridge.process([message(make_batch(f"edge-known-{i}", "b", [1], t), 10 + i)])
        assert value(registry, "gpu_exporter_bridge_new_nodes_total") == 15
        # names nobody introduced: a burst of three, then three a minute; the others wait
        new = [message(make_batch(f"edge-new-{i}", "b", [1], t), 100 + i) for i in range(5)]
        for m in new:
            bridge.process([m])
        later = message(make_batch("edge-new-3", "b", [2], t + 5), 105)  # waits behind its name's first
        bridge.process([later])
        bridge.process([message(make_batch("edge-known-3", "b", [2], t + 5), 200)])  # known names pass
        assert value(registry, held) == 3
        assert value(registry, "gpu_exporter_bridge_held_back_nodes") == 2
        assert [bridge.admission.holds(m) for m in (*new, later)] == [False, False, False, True, True, True]
        assert bridge.process_due() == 0  # no token yet
        clock.now += 20  # 3 a minute: one more token, for the name that waited first
        bridge.process_due()
        assert value(registry, held) == 1
        assert value(registry, "gpu_exporter_bridge_held_back_oldest_seconds") == 20
        clock.now += 20
        bridge.process_due()
        assert value(registry, held) == 0
    written = _nodes_written(rx)
    assert {node for node, _ in written} == (
        {f"edge-backlog-{i}" for i in range(5)}
        | {f"edge-known-{i}" for i in range(10)}
        | {f"edge-new-{i}" for i in range(5)}
    )
    # nothing lost: both batches of edge-new-3, in order, after the names admitted at once
    new3 = [ts for node, ts in written if node == "edge-new-3"]
    assert new3 == [round(t * 1000), round((t + 5) * 1000)]
    assert value(registry, "gpu_exporter_bridge_new_nodes_total") == 20
    assert value(registry, "gpu_exporter_bridge_new_nodes_refused_total") == 0
    assert value(registry, "gpu_exporter_bridge_held_back_total") == 3
    lines = [r.getMessage() for r in caplog.records if "new-nodes-burst" in r.getMessage()]
    assert len(lines) == 1  # one line a minute, however many wait


def test_a_flood_of_new_names_past_the_waiting_room_is_dropped_and_counted() -> None:
    """What waits takes at most half of the in-flight account (here 2 of 4 messages): past it, a batch
    of a new name is dropped, so invented names cannot hold the bridge's memory or stop the fleet."""
    clock = Clock()
    t = time.time() - 100
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(
            rx.url, new_nodes_per_minute=1, new_nodes_burst=1, receive_maximum=4, clock=clock
        )
        bridge.new_nodes.subscribed()
        clock.now += QUIET + 1
        for i in range(5):
            bridge.process([message(make_batch(f"edge-flood-{i}", "b", [1], t), i + 1)])
        bridge.process([message(make_batch("edge-flood-0", "b", [2], t + 5), 10)])  # admitted: it flows
        assert value(registry, "gpu_exporter_bridge_held_back_messages") == 2
        assert value(registry, "gpu_exporter_bridge_new_nodes_refused_total") == 2
        for _ in range(3):
            clock.now += 60
            bridge.process_due()
    assert {node for node, _ in _nodes_written(rx)} == {"edge-flood-0", "edge-flood-1", "edge-flood-2"}
    assert value(registry, "gpu_exporter_bridge_held_back_messages") == 0


def test_two_live_boots_of_one_node_are_twins_a_restart_with_its_backlog_is_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    t = time.time() - 600
    twins = "gpu_exporter_bridge_twin_batches_total"
    with ScriptedReceiver(_ok) as rx, caplog.at_level(logging.WARNING):
        bridge, registry = local_bridge(rx.url, clock=clock)
        # a restart: boot r1 stops, r2 starts, r1's spooled backlog arrives after r2's first batch
        bridge.process([message(make_batch("edge-restart", "r1", [1, 2, 3], t), 1)])
        bridge.process([message(make_batch("edge-restart", "r2", [1, 2], t + 60), 2)])
        bridge.process([message(make_batch("edge-restart", "r1", [4, 5], t + 15), 3)])
        # twins: two agents sample the same minutes under two boots, their batches interleave
        for k in range(4):
            clock.now += 30
            bridge.process([message(make_batch("edge-twin", "ta", [k * 2 + 1, k * 2 + 2], t + 30 * k), 10 + k)])
            bridge.process([message(make_batch("edge-twin", "tb", [k * 2 + 1, k * 2 + 2], t + 30 * k + 2), 20 + k)])
    assert value(registry, twins, node="edge-restart") == 0
    assert value(registry, twins, node="edge-twin") == 4  # the second batch of each stretch of time
    assert sum("edge-twin" in r.getMessage() and "two agents" in r.getMessage() for r in caplog.records) == 1
    assert rx.requests  # the twins' samples are still written: both report real GPUs


def test_a_boot_silent_for_longer_than_live_is_no_twin_of_a_new_boot_that_overlaps_it() -> None:
    """A node without a real-time clock reboots with its clock back where it stood: its new boot's samples
    fall in the old boot's span, but the old boot went silent 20 minutes ago: a restart, not a twin."""
    clock = Clock()
    t = time.time() - 3600
    twins = "gpu_exporter_bridge_twin_batches_total"
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url, clock=clock)
        bridge.process([message(make_batch("edge-rtc", "r1", list(range(1, 21)), t), 1)])  # 100 s of samples
        clock.now += LIVE + 600
        bridge.process([message(make_batch("edge-rtc", "r2", [1, 2], t + 10), 2)])
        assert value(registry, twins, node="edge-rtc") == 0
        clock.now += 30  # a second agent started meanwhile, over the same minutes: a twin
        bridge.process([message(make_batch("edge-rtc", "r3", [1, 2], t + 12), 3)])
    assert value(registry, twins, node="edge-rtc") == 1


def test_a_node_that_restarted_several_times_has_each_batch_of_its_twin_counted() -> None:
    """Only a few boots are remembered per node: the oldest heard goes first, never the live one."""
    clock = Clock()
    t = time.time() - 3600
    twins = "gpu_exporter_bridge_twin_batches_total"
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url, clock=clock)
        for k, boot in enumerate(("b1", "b2", "b3")):  # three short runs, one after the other
            clock.now += 60
            bridge.process([message(make_batch("edge-flappy", boot, [1, 2], t + 60 * k), k + 1)])
        clock.now += 60
        bridge.process([message(make_batch("edge-flappy", "b4", list(range(1, 41)), t + 300), 10)])  # 200 s
        for k in range(2):  # a twin starts over the same minutes; its batches come before b4's next
            clock.now += 10
            bridge.process([message(make_batch("edge-flappy", "tw", [2 * k + 1, 2 * k + 2], t + 350 + 50 * k), 20 + k)])
    assert value(registry, twins, node="edge-flappy") == 2


def test_bad_payloads_from_many_nodes_give_one_line_a_minute_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    with ScriptedReceiver(_ok) as rx, caplog.at_level(logging.WARNING):
        bridge, registry = local_bridge(rx.url)
        bridge.process([Received(i, 1, f"gpu-exporter/junk-{i}/batch", b"junk") for i in range(50)])
        bridge.process([Received(99, 1, "gpu-exporter/junk-0/batch", b"{" + b" " * (5 << 20) + b"}")])
    dropped = [r.getMessage() for r in caplog.records if "dropped a" in r.getMessage()]
    assert len(dropped) == 2  # one malformed, one oversized
    assert (
        sum(
            value(registry, "gpu_exporter_bridge_payloads_dropped_total", node=f"junk-{i}", reason="malformed")
            for i in range(50)
        )
        == 50
    )


def test_new_name_tokens_never_pile_up_past_the_burst_and_introduced_names_alone_pass() -> None:
    from gpu_exporter.bridge.limits import INTRODUCTION, NewNodes

    clock = Clock()
    names = NewNodes(per_minute=60, clock=clock, burst=5)
    names.subscribed()
    names.status("edge-introduced")
    # during the introduction a name nobody introduced takes a token like any other
    assert [names.take(f"edge-stranger-{i}") for i in range(6)] == [True] * 5 + [False]
    assert names.take("edge-introduced")  # introduced by its status message: no token needed
    clock.now += INTRODUCTION + 1  # the introduction is over
    clock.now += 86_400  # a quiet day: the bucket is full, never fuller than the burst
    taken = [names.take(f"edge-flood-{i}") for i in range(20)]
    assert taken == [True] * 5 + [False] * 15
    clock.now += 1  # 60 a minute: one more a second
    assert [names.take(f"edge-later-{i}") for i in range(3)] == [True, False, False]
