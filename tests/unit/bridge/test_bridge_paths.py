"""Bridge paths where data is at stake: Retry-After (seconds and HTTP date), the backoff caps, the
one-by-one retry of a group of messages that failed together, and the cap on per-node label values.

Waits are recorded, not slept: the writer's stop event is the one place it waits (``stop.wait``)."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge import messages
from gpu_exporter.bridge.convert import Converter
from gpu_exporter.bridge.remote_write import Series
from gpu_exporter.bridge.sender import RemoteWriter
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import encode
from tests.support.bridge_helpers import ScriptedReceiver, WaitRecorder, make_batch


def _series(n: int = 2) -> list[Series]:
    return [Series((("__name__", "m"), ("gpu", str(g))), [1000, 2000], [1.0, 2.0]) for g in range(n)]


def _waits_for(answers: list[tuple[int, bytes, dict[str, str]]], **writer: float) -> list[float]:
    """The waits between the attempts of one write that gets ``answers`` and then a 204."""
    stop = WaitRecorder()
    with ScriptedReceiver(lambda n: answers[n - 1] if n <= len(answers) else (204, b"", {})) as rx:
        outcome = RemoteWriter(rx.url, stop=stop, **writer).write(_series())  # type: ignore[arg-type]
        assert outcome.written == 4 and len(rx.requests) == len(answers) + 1
    return stop.waits


def test_retry_after_in_seconds_is_honoured() -> None:
    waits = _waits_for([(429, b"slow down", {"Retry-After": "4"})], backoff_min=0.01, backoff_max=30)
    assert len(waits) == 1 and 0.8 * 4 <= waits[0] <= 4


def test_retry_after_as_an_http_date_is_honoured() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)  # "Tue, 01 Dec 2026 04:20:00 GMT"
    waits = _waits_for([(503, b"maintenance", {"Retry-After": when})], backoff_min=0.01, backoff_max=60)
    # whole seconds in the header, the writer's own 0.8-1.0 jitter, and up to 5 s for the request to go out
    assert len(waits) == 1 and 0.8 * 24 <= waits[0] <= 30


@pytest.mark.parametrize("value", ["", "soon", "Tue, 99 Foo 2026 99:99:99 GMT", "-5"])
def test_an_unusable_retry_after_falls_back_to_the_backoff(value: str) -> None:
    waits = _waits_for([(429, b"slow down", {"Retry-After": value})], backoff_min=0.5, backoff_max=30)
    assert len(waits) == 1 and 0.8 * 0.5 <= waits[0] <= 0.5


def test_a_retry_after_beyond_the_backoff_cap_is_capped() -> None:
    waits = _waits_for([(429, b"slow down", {"Retry-After": "3600"})], backoff_min=0.01, backoff_max=2)
    assert len(waits) == 1 and 0.8 * 2 <= waits[0] <= 2


def test_the_backoff_doubles_up_to_its_cap() -> None:
    waits = _waits_for([(503, b"busy", {})] * 7, backoff_min=0.5, backoff_max=4)
    nominal = [0.5, 1, 2, 4, 4, 4, 4]
    assert len(waits) == len(nominal)
    for wait, expected in zip(waits, nominal, strict=True):
        assert 0.8 * expected <= wait <= expected


# ------------------------------------------------------------------------------- the writer's group retry


class PoisonConverter(Converter):
    """A converter with a bug that only one node's batches trigger (the group retry's reason to exist)."""

    def convert(self, items):  # type: ignore[no-untyped-def]
        items = list(items)
        if any(batch.node == "edge-poison" for batch, _ in items):
            raise KeyError("planted bug")
        return super().convert(items)


@pytest.fixture
def receiver() -> Iterator[ScriptedReceiver]:
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        yield rx


def _bridge(receiver: ScriptedReceiver) -> tuple[Bridge, CollectorRegistry]:
    registry = CollectorRegistry()
    settings = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=receiver.url, topic_prefix="t")
    return Bridge(settings, registry), registry


def _msg(node: str, seqs: list[int]) -> Received:
    return Received(1, 1, f"t/{node}/batch", encode(make_batch(node, "boot", seqs, time.time() - 60)))


def _nodes_written(receiver: ScriptedReceiver) -> set[str]:
    return {dict(labels).get("node", "") for req in receiver.requests for labels, _ in req.series}


def test_a_group_that_fails_is_retried_one_by_one_and_only_the_bad_message_is_dropped(
    receiver: ScriptedReceiver,
) -> None:
    bridge, registry = _bridge(receiver)
    bridge._converter = PoisonConverter()
    msgs = [_msg("edge-1", [1, 2]), _msg("edge-poison", [1]), _msg("edge-2", [5])]

    written = bridge.process_safely(msgs)

    alone = _bridge(receiver)[0].process([_msg("edge-1", [1, 2]), _msg("edge-2", [5])])
    assert written == alone > 0  # everything of the good messages, nothing of the bad one
    assert _nodes_written(receiver) == {"edge-1", "edge-2"}
    dropped = registry.get_sample_value
    assert dropped("gpu_exporter_bridge_payloads_dropped_total", {"node": "edge-poison", "reason": "error"}) == 1
    assert dropped("gpu_exporter_bridge_payloads_dropped_total", {"node": "edge-1", "reason": "error"}) is None


def test_a_group_that_fails_only_together_is_written_in_full_by_the_retry(receiver: ScriptedReceiver) -> None:
    class TogetherOnly(Converter):
        def convert(self, items):  # type: ignore[no-untyped-def]
            items = list(items)
            if len(items) > 1:
                raise ValueError("planted bug")
            return super().convert(items)

    bridge, registry = _bridge(receiver)
    bridge._converter = TogetherOnly()
    written = bridge.process_safely([_msg("edge-1", [1]), _msg("edge-2", [1])])
    assert written > 0 and _nodes_written(receiver) == {"edge-1", "edge-2"}
    assert not [
        s for m in registry.collect() for s in m.samples if s.name == "gpu_exporter_bridge_payloads_dropped_total"
    ]


def test_per_node_label_values_are_capped(receiver: ScriptedReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(messages, "MAX_NODES", 5)
    bridge, registry = _bridge(receiver)
    bridge.process([Received(1, 1, f"t/junk-{i}/batch", b"junk") for i in range(12)])
    nodes = {
        s.labels["node"]: s.value
        for m in registry.collect()
        for s in m.samples
        if s.name == "gpu_exporter_bridge_payloads_dropped_total"
    }
    assert len(nodes) == 6  # five named nodes and one "_other"
    assert nodes.pop("_other") == 7
    assert set(nodes) == {f"junk-{i}" for i in range(5)}
