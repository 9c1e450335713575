"""A payload sized for the broker's Maximum Packet Size goes as a PUBLISH within it, header counted (by class).

The ground truth is the packet paho-mqtt itself builds (its PUBLISH serialiser, the bytes that go on the
wire), with the send-time stamp of mqtt/sendtime.py at its largest; what is checked is the agent's own
arithmetic (mqtt/packet.py) and the summaries' cut (forward/adaptive.py ``_cut`` over payload/split.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.forward.adaptive import Adaptive
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.prepare import round_values
from gpu_exporter.forward.summary import encode_summary, summarize
from gpu_exporter.model import Sample
from gpu_exporter.mqtt import sendtime
from gpu_exporter.mqtt.packet import payload_budget, publish_size
from gpu_exporter.payload import Batch, decode, encode
from tests.support.samples import fixed_sample

LATEST_STAMP = 99_999_999_999.999  # the largest send time PACKED_MAX is sized for


def wire_size(topic: str, payload: int, v5: bool, now: float = LATEST_STAMP) -> int:
    """Bytes of the QoS 1 PUBLISH paho-mqtt builds for ``payload`` bytes to ``topic``, as the agent sends it."""
    version = paho.MQTTv5 if v5 else paho.MQTTv311
    client = paho.Client(paho.CallbackAPIVersion.VERSION2, protocol=version, client_id="t")  # type: ignore[attr-defined]
    packets: list[bytes] = []

    def queue(command: int, packet: bytearray, *rest: Any) -> int:
        packets.append(bytes(packet))
        return 0

    client._packet_queue = queue  # type: ignore[method-assign,assignment]  # capture the bytes instead of sending
    client._sock = object()  # type: ignore[assignment]  # "connected": paho builds nothing without a socket
    props = sendtime.properties(now) if v5 else None
    try:
        client._send_publish(1, topic.encode("utf-8"), b"x" * payload, qos=1, properties=props)
    finally:
        client._sock = None  # paho's __del__ closes what it holds: nothing here
    (packet,) = packets
    return len(packet)


topics = st.builds(
    lambda prefix, node: f"{prefix}/{node}/batch",
    st.sampled_from(["gpu-exporter", "g", "fleet/eu-west/site-42"]),
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=80),
)
# payload sizes around the remaining length's varint steps (127/128, 16383/16384, 2097151/2097152)
near_steps = st.one_of(
    st.integers(0, 300),
    st.integers(16_000, 16_700),
    st.integers(2_096_800, 2_097_400),
    st.integers(0, 300_000),
)


def _at_a_step(topic: str, v5: bool, step: int, offset: int) -> int:
    """A payload whose PUBLISH's remaining length is ``offset`` bytes from the varint step ``step``."""
    fixed = 2 + len(topic.encode("utf-8")) + 2 + (sendtime.PACKED_MAX if v5 else 0)
    return max(0, step - fixed + offset)


@settings(max_examples=120, deadline=None)
@given(
    topic=topics,
    payload=near_steps,
    v5=st.booleans(),
    now=st.floats(1.0, LATEST_STAMP),
    step=st.sampled_from([None, 128, 16_384, 2_097_152]),
    offset=st.integers(-3, 3),
)
def test_publish_size_is_the_packet_paho_sends(
    topic: str, payload: int, v5: bool, now: float, step: int | None, offset: int
) -> None:
    if step is not None:
        payload = _at_a_step(topic, v5, step, offset)
    assert publish_size(topic, payload, v5) == wire_size(topic, payload, v5)  # the largest stamp, exactly
    assert wire_size(topic, payload, v5, now) <= publish_size(topic, payload, v5)  # any earlier one within


@settings(max_examples=120, deadline=None)
@given(
    topic=topics,
    max_packet=near_steps,
    v5=st.booleans(),
    step=st.sampled_from([None, 128, 16_384, 2_097_152]),
    offset=st.integers(-3, 3),
)
def test_the_payload_budget_is_the_largest_payload_whose_packet_fits(
    topic: str, max_packet: int, v5: bool, step: int | None, offset: int
) -> None:
    if step is not None:  # a limit where the largest packet's length field is about to grow
        max_packet = publish_size(topic, _at_a_step(topic, v5, step, 0), v5) + offset
    budget = payload_budget(topic, max_packet, v5)
    if wire_size(topic, 0, v5) > max_packet:
        assert budget == 0
        return
    assert wire_size(topic, budget, v5) <= max_packet
    assert wire_size(topic, budget + 1, v5) > max_packet  # and not a byte less than what fits


@dataclass
class BrokerLink:
    """What ``_cut`` asks of the link: the broker's limit (CONNACK's Maximum Packet Size) and the version."""

    limit: int
    v5: bool

    def packet_limit(self) -> int:
        return self.limit


@pytest.fixture(scope="module")
def batches() -> list[Batch]:
    """A summary of 4 simulated GPUs and a full-resolution batch, as the forwarder cuts them."""
    first = round_values(fixed_sample(gpus=4, mig=0), 4)
    samples = [Sample(seq, first.timestamp + seq, first.devices) for seq in range(1, 4)]
    summary = decode(encode_summary("edge-07", "b" * 32, [summarize(samples, digits=3)], 3.0))
    return [summary, Batch("edge-07", "b" * 32, tuple(samples))]


def _values(batches: list[Batch]) -> set[tuple[int, str, object, float]]:
    return {
        (s.seq, d.device.uuid, k, v) for b in batches for s in b.samples for d in s.devices for k, v in d.values.items()
    }


@settings(max_examples=40, deadline=None)
@given(which=st.integers(0, 1), delta=st.integers(-60, 60), shrink=st.sampled_from([1, 1, 2, 3]), v5=st.booleans())
def test_a_batch_near_the_broker_limit_goes_in_packets_within_it(
    batches: list[Batch], which: int, delta: int, shrink: int, v5: bool
) -> None:
    batch = batches[which]
    topic = f"gpu-exporter/{batch.node}/summary"
    whole = len(encode(batch))
    limit = publish_size(topic, whole // shrink, v5) + delta  # just under, at and just over the whole batch
    adaptive = Adaptive(batch.node, batch.boot, LinkMeter(None), 3.0)
    parts = adaptive._cut(batch, BrokerLink(limit, v5), topic)  # type: ignore[arg-type]
    assert parts
    for data in parts:
        assert wire_size(topic, len(data), v5) <= limit, (len(data), limit)
    assert _values([decode(d) for d in parts]) == _values([batch])  # nothing lost on the way
