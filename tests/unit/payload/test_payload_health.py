"""Health reports in the payload (payload/health.py, docs/payload.md "Health reports"): what the encoder
writes, what both readers take and refuse, and that batches without health read as before."""

from __future__ import annotations

import json
import zlib
from typing import Any

import jsonschema
import pytest

from gpu_exporter import payload as codec
from gpu_exporter.model import Sample
from gpu_exporter.payload import Batch, HealthValue, PayloadError, columns, decode, encode, to_document
from gpu_exporter.payload._zdict import ZDICT_HEALTH
from tests.support.samples import fixed_sample

VALUES = (
    HealthValue("gpu_exporter_collect_duration_seconds", (), 0.0123),
    HealthValue("gpu_exporter_last_collect_success_timestamp_seconds", (), 1764412800.25),
    HealthValue("gpu_exporter_forward_dropped_batches_total", (("reason", "max_bytes"),), 3.0),
    HealthValue("gpu_exporter_build_info", (("revision", ""), ("version", "0.1.0")), 1.0),
)


def report(values: tuple[HealthValue, ...] = VALUES, seq: int = 7) -> Batch:
    return Batch("edge-7", "b" * 32, (Sample(seq, 1764412830.5, ()),), health=values)


def document(**changes: Any) -> dict[str, Any]:
    doc = to_document(report())
    doc.update(changes)
    return doc


def test_a_report_goes_through_both_readers_value_for_value() -> None:
    data = encode(report())
    assert data[2:6] == zlib.adler32(ZDICT_HEALTH).to_bytes(4, "big")  # framed with its own dictionary
    assert decode(data) == report()
    read = columns.read(data)
    assert read.health == VALUES and read.seqs == [7] and read.times_ms == [1764412830500]
    assert read.devices == [] and not read.metrics
    codec.verify(data)
    jsonschema.validate(to_document(report()), codec.schema())


def test_the_health_dictionary_is_frozen() -> None:
    """A reader finds the dictionary by its Adler-32: changing it would make reports unreadable."""
    assert zlib.adler32(ZDICT_HEALTH) == 0x1523F815


def test_a_batch_without_health_reads_as_before() -> None:
    batch = Batch("edge-7", "b" * 32, (fixed_sample(gpus=1, mig=0),))
    doc = to_document(batch)
    assert "health" not in doc
    assert decode(encode(batch)).health == ()
    assert columns.read(encode(batch)).health == ()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"health": []}, "health must be an array of 1 to"),
        ({"health": "x"}, "health must be an array of 1 to"),
        ({"health": [["1bad", [], 1]]}, "invalid metric name"),
        ({"health": [["ok", ["__name__", "x"], 1]]}, "reserved"),
        ({"health": [["ok", ["a"], 1]]}, "labels must be"),
        ({"health": [["ok", ["a", 1], 1]]}, "label a must be a string"),
        ({"health": [["ok", ["a", "x", "a", "y"], 1]]}, "a label is given twice"),
        ({"health": [["ok", [], "NaN"]]}, "finite number"),
        ({"health": [["ok", [], True]]}, "finite number"),
        ({"health": [["ok", [], 1], ["ok", [], 2]]}, "listed twice"),
        ({"health": [["ok", [], 1]] * 2}, "listed twice"),
        ({"health": [[f"m{i}", [], 1] for i in range(1025)]}, "health must be an array of 1 to"),
        ({"summary_ms": 1000}, "holds no metrics, devices, summary_ms or part"),
        ({"part": "0123456789abcdef"}, "holds no metrics, devices, summary_ms or part"),
        ({"seq": [7, 1], "time_ms": [1, 1], "last_seq": 8}, "exactly one entry in seq"),
    ],
)
def test_a_malformed_report_is_refused_by_both_readers(changes: dict[str, Any], message: str) -> None:
    data = json.dumps(document(**changes)).encode()
    for read in (decode, columns.read):
        with pytest.raises(PayloadError, match=message) as caught:
            read(data)
        assert "\n" not in str(caught.value)


def test_a_report_with_device_data_is_refused() -> None:
    doc = to_document(Batch("edge-7", "b" * 32, (fixed_sample(gpus=1, mig=0),)))
    doc["health"] = [["gpu_exporter_collects_total", [], 1]]
    with pytest.raises(PayloadError, match="holds no metrics, devices"):
        decode(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "batch",
    [
        Batch("n", "b", (Sample(1, 1.0, ()), Sample(2, 2.0, ())), health=VALUES),
        Batch("n", "b", (fixed_sample(gpus=1, mig=0),), health=VALUES),
        Batch("n", "b", (Sample(1, 1.0, ()),), summary_ms=1000, health=VALUES),
        Batch("n", "b", (Sample(1, 1.0, ()),), health=(HealthValue("x", (), float("nan")),)),
        Batch("n", "b", (Sample(1, 1.0, ()),), health=(HealthValue("x", (("__a", "1"),), 1.0),)),
    ],
)
def test_the_encoder_refuses_what_readers_would(batch: Batch) -> None:
    with pytest.raises(ValueError):
        encode(batch)


def test_the_health_report_in_docs_payload_md_reads() -> None:
    from tests.support import paths

    text = (paths.ROOT / "docs" / "payload.md").read_text(encoding="utf-8")
    example = text.split("## Health reports", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    jsonschema.validate(json.loads(example), codec.schema())
    batch = decode(example.encode())
    assert batch.first_seq == 42 and not batch.samples[0].devices
    assert batch.health[3] == HealthValue("gpu_exporter_forward_dropped_batches_total", (("reason", "max_age"),), 0.0)
