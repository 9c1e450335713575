"""Cutting samples to fit a packet limit (payload/split.py), the payload's ``part`` field, and the
bridge's replay check by part: a sample cut in parts arrives whole, and a part sent twice is written once.

The samples are 8 simulated GPUs read through the real NVML backend at real times (so the readings move
between samples as they do on a live node): one such sample is 1.2-1.3 kB as a payload.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import jsonschema
import pytest

from gpu_exporter import config as cfg
from gpu_exporter import payload as codec
from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.bridge.dedup import SeqTracker
from gpu_exporter.bridge.service import _stream
from gpu_exporter.forward.prepare import round_values
from gpu_exporter.forward.summary import encode_summary, summarize
from gpu_exporter.model import Sample
from gpu_exporter.payload import Batch, PayloadError, columns, decode, encode, to_document
from gpu_exporter.payload.split import part_name, split

NODE, BOOT = "edge-07", "f8693b5d0e1c4a5f9d3b2a1c0e9f8d7c"


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    """12 samples of 8 simulated GPUs, 0.25 s apart in real time, rounded as the forwarder sends them."""
    backend = NvmlBackend(cfg.Config(gpu_vendor="fake", fake_gpus=8), nvml=SimNvml(gpus=8))
    backend.open()
    out = []
    try:
        for seq in range(1, 13):
            out.append(round_values(Sample(seq, time.time(), tuple(backend.read())), 4))
            time.sleep(0.25)
    finally:
        backend.close()
    return out


def values(batches: Iterator[Batch] | list[Batch]) -> set[tuple[int, str, str, tuple[str, ...], float]]:
    return {
        (s.seq, d.device.uuid, key, labels, v)
        for b in batches
        for s in b.samples
        for d in s.devices
        for (key, labels), v in d.values.items()
    }


@pytest.mark.parametrize("limit", [100_000, 4000, 2048, 1500, 600, 250])
def test_every_value_arrives_in_parts_that_fit_and_only_a_single_oversized_series_is_left_out(
    samples: list[Sample], limit: int
) -> None:
    batch = Batch(NODE, BOOT, tuple(samples))
    parts, unfit = split(batch, limit)
    assert all(len(data) <= limit for _, data in parts)
    decoded = [decode(data) for _, data in parts]
    assert [d.part for d in decoded] == [b.part for b, _ in parts]  # the name travels
    left_out = {(s.seq, s.devices[0].device.uuid, *next(iter(s.devices[0].values))) for s, _ in unfit}
    kept = values(decoded)
    assert {v[:4] for v in kept} | left_out == {v[:4] for v in values([batch])}
    assert kept <= values([batch])
    assert all(len(s.devices) == 1 and len(s.devices[0].values) <= 1 for s, _ in unfit)
    assert not unfit or limit < 300  # a single series takes a couple of hundred bytes with its header
    # no two payloads of the same sample share a name: none would be taken for a replay of another
    names = [(d.part, s.seq) for d in decoded for s in d.samples]
    assert len(names) == len(set(names))
    whole = [d for d in decoded if not d.part]
    assert all(len(s.devices) == 8 for d in whole for s in d.samples)  # unnamed means the whole sample


def test_a_part_cut_again_gets_the_names_it_would_have_had_from_the_start(samples: list[Sample]) -> None:
    one = Batch(NODE, BOOT, (samples[0],))
    direct, _ = split(one, 600)
    coarse, _ = split(one, 2048)
    again = [piece for b, _ in coarse for piece in split(b, 600)[0]]
    assert [(b.part, values([b])) for b, _ in again] == [(b.part, values([b])) for b, _ in direct]
    assert all(b.part for b, _ in direct)


def test_part_names_depend_on_what_the_part_holds_only(samples: list[Sample]) -> None:
    devs = [d.device for d in samples[0].devices]
    assert part_name(devs[:4]) == part_name(list(reversed(devs[:4])))
    assert part_name(devs[:4]) != part_name(devs[4:])
    keys = sorted(samples[0].devices[0].values)
    assert part_name(devs[:1], keys[:10]) != part_name(devs[:1])
    assert part_name(devs[:1], keys[:10]) != part_name(devs[:1], keys[10:20])


def test_a_summary_that_does_not_fit_is_cut_by_device_too(samples: list[Sample]) -> None:
    point = summarize(samples)
    data = encode_summary(NODE, BOOT, [point], 3.0)
    parts, unfit = split(decode(data), len(data) // 3)
    assert len(parts) >= 3 and not unfit
    decoded = [decode(d) for _, d in parts]
    assert all(d.summary_ms == 3000 and d.part for d in decoded)
    assert values(decoded) == values([decode(data)])


def test_the_part_field_round_trips_passes_the_schema_and_is_refused_when_malformed(samples: list[Sample]) -> None:
    validator = jsonschema.Draft202012Validator(codec.schema())
    (piece, data), *_ = split(Batch(NODE, BOOT, (samples[0],)), 900)[0]
    assert piece.part and decode(data).part == piece.part
    assert codec.peek(data).part == piece.part
    doc = to_document(piece)
    validator.validate(doc)
    for bad in ("", "ABCDEF0123456789", "0123", 12, None, "0123456789abcdef0"):
        doc["part"] = bad
        assert list(validator.iter_errors(doc)), bad
        with pytest.raises(PayloadError, match="part"):
            codec.from_document(dict(doc))
    with pytest.raises(ValueError, match="part"):
        encode(Batch(NODE, BOOT, (samples[0],), part="not-hex"))


def test_the_bridge_writes_every_part_of_a_sample_and_drops_a_part_sent_twice(samples: list[Sample]) -> None:
    """The bridge's replay check, as its service runs it: (node, stream, seq) marked once written."""
    parts, _ = split(Batch(NODE, BOOT, tuple(samples[:3])), 700)
    tracker = SeqTracker()
    written: list[columns.ColumnBatch] = []
    for _, data in [*parts, parts[1], parts[-1]]:  # two parts delivered twice (a lost PUBACK)
        batch = columns.read(data)
        fresh = tracker.unseen(batch.node, _stream(batch), batch.seqs)
        if fresh:
            written.append(batch)
            tracker.mark(batch.node, _stream(batch), batch.seqs)
    assert len(written) == len(parts)  # every part once, the repeats dropped
    got = {(seq, dev.device.uuid) for b in written for seq in b.seqs for dev in b.devices}
    assert got == {(s.seq, d.device.uuid) for s in samples[:3] for d in s.devices}


def test_a_payload_without_parts_is_read_as_before(samples: list[Sample]) -> None:
    data = encode(Batch(NODE, BOOT, tuple(samples[:2])))
    assert decode(data).part == "" and columns.read(data).part == ""
    assert _stream(columns.read(data)) == BOOT
