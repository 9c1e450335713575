"""What the bridge remembers as written, and when: a replay (a batch the broker delivered twice, a spool
resent after a lost PUBACK) is written once, in bounded memory, and only what remote storage accepted
counts as written. Each test runs the bridge's real decode, dedup and write path (``Bridge.process``)
against an HTTP remote-write receiver that records every request."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.remote_write import Series
from gpu_exporter.bridge.sender import WriteOutcome
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch

T0 = time.time() - 86400  # a day ago: every sample (5 s apart) is in the past, none near the epoch


@pytest.fixture
def receiver() -> Iterator[ScriptedReceiver]:
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        yield rx


def _bridge(receiver: ScriptedReceiver, **settings: int) -> tuple[Bridge, CollectorRegistry]:
    registry = CollectorRegistry()
    config = BridgeSettings(
        mqtt_url="mqtt://127.0.0.1:1",
        remote_write_url=receiver.url,
        topic_prefix="t",
        rw_backoff_max=0.05,
        **settings,  # type: ignore[arg-type]
    )
    return Bridge(config, registry), registry


def _msg(node: str, seqs: list[int], boot: str = "boot-1") -> Received:
    return Received(1, 1, f"t/{node}/batch", encode(make_batch(node, boot, seqs, T0 + seqs[0] * 5.0, gpus=1)))


def _stamps(receiver: ScriptedReceiver, node: str) -> list[int]:
    """Every timestamp written for ``node``'s ``gpu_power_watts`` (one value per sample), in order."""
    return [
        t
        for req in receiver.requests
        for labels, points in req.series
        if ("node", node) in labels and ("__name__", "gpu_power_watts") in labels
        for t, _ in points
    ]


def _duplicates(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("gpu_exporter_bridge_duplicate_samples_total") or 0.0


def test_a_recent_replay_is_written_once_however_many_gaps_came_before(receiver: ScriptedReceiver) -> None:
    """100 batches with gaps between them (samples the agent's full spool dropped) are more disjoint
    ranges than the bridge keeps per boot: it forgets the oldest, never the newest."""
    bridge, registry = _bridge(receiver)
    for seq in range(1, 200, 2):  # seqs 1, 3, 5, ..., 199: 100 separate ranges
        assert bridge.process([_msg("edge-gappy", [seq])]) > 0
    written = len(_stamps(receiver, "edge-gappy"))
    assert written == 100
    # the broker delivers the latest batches again (the bridge's session resumed, the agent resent)
    replays = [_msg("edge-gappy", [seq]) for seq in (199, 197, 181, 161)]
    assert bridge.process(replays) == 0
    assert len(_stamps(receiver, "edge-gappy")) == written, "a recent replay was written twice"
    assert _duplicates(registry) == 4
    assert len(bridge.dedup.ranges("edge-gappy", "boot-1")) <= 64  # bounded all the same


def test_consecutive_batches_are_one_range_so_nothing_of_a_long_run_is_forgotten(
    receiver: ScriptedReceiver,
) -> None:
    bridge, registry = _bridge(receiver)
    batches = [_msg("edge-steady", [s, s + 1]) for s in range(1, 1000, 2)]  # 500 batches, seqs 1..1000
    assert bridge.process(batches) > 0
    written = len(_stamps(receiver, "edge-steady"))
    assert written == 1000
    assert bridge.dedup.ranges("edge-steady", "boot-1") == [(1, 1000)]
    # the whole spool resent: the first batch, the last, and one in the middle are all known
    assert bridge.process([batches[0], batches[-1], batches[250]]) == 0
    assert len(_stamps(receiver, "edge-steady")) == written
    assert _duplicates(registry) == 6


def test_a_busy_node_keeps_its_replay_memory_while_idle_nodes_are_forgotten_first(
    receiver: ScriptedReceiver,
) -> None:
    """At most ``dedup_streams`` (node, boot) pairs are remembered, the least recently written first out."""
    bridge, registry = _bridge(receiver, dedup_streams=3)
    bridge.process([_msg("edge-busy", [1, 2])])
    bridge.process([_msg("edge-idle-1", [1])])
    bridge.process([_msg("edge-idle-2", [1])])
    bridge.process([_msg("edge-busy", [3, 4])])  # the busy node writes again: most recent now
    bridge.process([_msg("edge-new", [1])])  # a fourth stream: the least recently written one goes
    before = len(_stamps(receiver, "edge-busy"))
    assert bridge.process([_msg("edge-busy", [1, 2]), _msg("edge-busy", [3, 4])]) == 0
    assert len(_stamps(receiver, "edge-busy")) == before == 4
    assert _duplicates(registry) == 4


class FailsOnce:
    """The bridge's writer with a bug that the first group of messages triggers (an exception that is
    not a network error: the reason the bridge retries a failed group one message at a time)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.calls = 0

    def write(self, series: Sequence[Series]) -> WriteOutcome:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("planted bug in the writer")
        return self.inner.write(series)  # type: ignore[attr-defined, no-any-return]

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]


def test_a_write_that_failed_does_not_count_its_samples_as_written(receiver: ScriptedReceiver) -> None:
    """A sample is remembered as written only after remote storage took it: the one-by-one retry of a
    group whose write failed writes every sample, none is taken for a replay."""
    bridge, registry = _bridge(receiver)
    bridge._writer = FailsOnce(bridge._writer)  # type: ignore[assignment]
    msgs = [_msg(f"edge-{n}", list(range(1, 13))) for n in range(3)]  # 3 nodes x 12 samples
    written = bridge.process_safely(msgs)
    for n in range(3):
        assert len(_stamps(receiver, f"edge-{n}")) == 12, f"edge-{n}: samples lost to the failed write"
    assert written > 0 and _duplicates(registry) == 0
    dropped = [
        s for m in registry.collect() for s in m.samples if s.name == "gpu_exporter_bridge_payloads_dropped_total"
    ]
    assert not dropped
