"""Fuzzing the bridge's decode path: arbitrary bytes never raise out of the message handler, and the
column reader refuses them with its own checks (not with an IndexError it wrapped into PayloadError)."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import columns, decode, encode
from tests.support.bridge_helpers import ScriptedReceiver, make_batch
from tests.support.payload_helpers import strictly

VALID = encode(make_batch("edge-1", "boot", [1, 2, 3], 1_700_000_000.0), compress=False)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=30,
)


@pytest.fixture(scope="module")
def receiver() -> Iterator[ScriptedReceiver]:
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        yield rx


@pytest.fixture(scope="module")
def bridge(receiver: ScriptedReceiver) -> Bridge:
    # Never started: process() is the writer thread's body, called directly; no broker needed.
    settings = BridgeSettings(
        mqtt_url="mqtt://127.0.0.1:1", remote_write_url=receiver.url, topic_prefix="t", max_payload=64 * 1024
    )
    return Bridge(settings, CollectorRegistry())


def _msg(payload: bytes, topic: str = "t/edge-1/batch") -> Received:
    return Received(1, 1, topic, payload)


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=2048))
def test_arbitrary_bytes_never_raise(bridge: Bridge, data: bytes) -> None:
    assert strictly(columns.read, data) is None
    assert bridge.handler.decode(_msg(data)) is None


@FUZZ
@given(st.binary(max_size=512), st.binary(max_size=64))
def test_gzip_of_arbitrary_bytes_never_raises(bridge: Bridge, body: bytes, tail: bytes) -> None:
    for data in (gzip.compress(body), gzip.compress(body) + tail, gzip.compress(body)[: len(body) // 2]):
        strictly(columns.read, data)
        bridge.handler.decode(_msg(data))


@FUZZ
@given(st.data())
def test_mutated_valid_payloads_never_raise(bridge: Bridge, data: st.DataObject) -> None:
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 8))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    for candidate in (bytes(raw), bytes(raw[:cut]), gzip.compress(bytes(raw))):
        strictly(columns.read, candidate)
        bridge.handler.decode(_msg(candidate))


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from(["node", "boot", "seq", "time_ms", "metrics", "devices", "first_seq", "last_seq", "x"]),
        json_values,
        max_size=10,
    )
)
def test_structured_documents_with_wrong_fields_never_raise(bridge: Bridge, fields: dict[str, object]) -> None:
    doc = json.loads(VALID)
    doc.update(fields)
    strictly(columns.read, json.dumps(doc).encode())
    bridge.handler.decode(_msg(json.dumps(doc).encode()))


def _fresh_bridge(receiver: ScriptedReceiver) -> tuple[Bridge, CollectorRegistry]:
    registry = CollectorRegistry()
    settings_ = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=receiver.url, topic_prefix="t")
    return Bridge(settings_, registry), registry


@pytest.fixture(scope="module")
def valid_written(receiver: ScriptedReceiver) -> int:
    """Samples the bridge writes for VALID alone (its values plus the bridge's own per-device series)."""
    written = _fresh_bridge(receiver)[0].process([_msg(VALID)])
    assert written > len(list(decode(VALID).points())) > 0
    return written


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=300) | st.just(VALID), min_size=1, max_size=6), st.text(max_size=30))
def test_the_writer_path_survives_any_mix_of_messages(
    receiver: ScriptedReceiver, valid_written: int, payloads: list[bytes], topic: str
) -> None:
    # Whatever arrives, process() decodes what it can, writes it (a repeat of the valid batch once), drops
    # and counts the rest, and returns; it never raises.
    b, registry = _fresh_bridge(receiver)
    msgs = [_msg(p, "t/edge-1/batch" if p == VALID else topic) for p in payloads]
    written = b.process(msgs)
    assert written == (valid_written if VALID in payloads else 0)
    dropped = sum(
        s.value for s in registry.collect() for s in s.samples if s.name == "gpu_exporter_bridge_payloads_dropped_total"
    )
    assert dropped == sum(p != VALID for p in payloads)


def test_malformed_messages_are_counted_per_node_from_the_topic(receiver: ScriptedReceiver) -> None:
    registry = CollectorRegistry()
    settings_ = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=receiver.url, topic_prefix="t")
    b = Bridge(settings_, registry)
    fresh = encode(make_batch("edge-9", "boot", [1], time.time()))
    b.process([_msg(b"junk", "t/edge-7/batch"), _msg(b"", "t/edge-7/batch"), _msg(fresh, "t/edge-9/batch")])
    value = registry.get_sample_value
    assert value("gpu_exporter_bridge_payloads_dropped_total", {"node": "edge-7", "reason": "malformed"}) == 2
    assert value("gpu_exporter_bridge_gpu_samples_written_total") == 2


@pytest.mark.parametrize("where", ["node", "device", "info", "label"])
def test_a_lone_surrogate_is_a_malformed_payload_not_a_stuck_write(receiver: ScriptedReceiver, where: str) -> None:
    # JSON may escape a lone surrogate (\\ud800); Python decodes it, but it has no UTF-8 form, so it
    # could never be written as a label. It must be dropped up front, not fail every write attempt.
    registry = CollectorRegistry()
    b = Bridge(BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=receiver.url, topic_prefix="t"), registry)
    doc = json.loads(encode(make_batch("edge-s", "boot", [1], time.time()), compress=False))
    if where == "node":
        doc["node"] = "edge-\ud800"
    elif where == "device":
        doc["devices"][0]["id"]["uuid"] = "GPU-\udfff"
    elif where == "info":
        doc["devices"][0]["info"]["name"] = "\ud800"
    else:
        doc["metrics"].append(["xid_errors", ["\ud800"]])
        for dev in doc["devices"]:
            dev["columns"].append(None)
    before = len(receiver.requests)
    assert b.process([_msg(json.dumps(doc).encode(), "t/edge-s/batch")]) == 0
    assert len(receiver.requests) == before
    assert (
        registry.get_sample_value(
            "gpu_exporter_bridge_payloads_dropped_total", {"node": "edge-s", "reason": "malformed"}
        )
        == 1
    )
