"""The bridge's columnar reader accepts exactly what the payload codec accepts, with the same values."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.bridge import columns
from gpu_exporter.forward import batch as codec
from gpu_exporter.model import DeviceId, DeviceSample, Sample

from .bridge_helpers import make_batch

KEYS = [("utilization", ()), ("power", ()), ("energy", ()), ("xid_errors", ("79",)), ("memory_used", ())]
values = st.one_of(
    st.integers(-(10**12), 10**12).map(float),
    st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(float),
    st.floats(allow_nan=True, allow_infinity=True),
)


@st.composite
def batches(draw: st.DrawFn) -> codec.Batch:
    n = draw(st.integers(1, 5))
    ndev = draw(st.integers(1, 3))
    seq0 = draw(st.integers(1, 10**6))
    seqs = sorted(set(draw(st.lists(st.integers(seq0, seq0 + 50), min_size=n, max_size=n))))
    samples = []
    for i, seq in enumerate(seqs):
        devices = []
        for d in range(ndev):
            if draw(st.booleans()) and draw(st.booleans()):
                continue  # absent from this sample
            vals = {k: draw(values) for k in KEYS if draw(st.booleans())}
            devices.append(DeviceSample(DeviceId(str(d), f"GPU-{d}"), draw(st.booleans()), vals, {"name": "x"}))
        samples.append(Sample(seq, 1_700_000_000 + i * 5 + draw(st.integers(0, 999)) / 1000, tuple(devices)))
    return codec.Batch("edge", "boot", tuple(samples))


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@settings(max_examples=150, deadline=None)
@given(batches(), st.booleans())
def test_columns_hold_the_values_the_codec_decodes(batch: codec.Batch, compress: bool) -> None:
    data = codec.encode(batch, compress=compress)
    objects = codec.decode(data)
    cols = columns.read(data)
    assert (cols.node, cols.boot) == (objects.node, objects.boot)
    assert cols.seqs == [s.seq for s in objects.samples]
    assert cols.times_ms == [round(s.timestamp * 1000) for s in objects.samples]
    by_device = {d.device: d for d in cols.devices}
    for i, sample in enumerate(objects.samples):
        present = {ds.device for ds in sample.devices}
        for device, cd in by_device.items():
            assert (cd.up[i] is not None) == (device in present)
        for ds in sample.devices:
            cd = by_device[ds.device]
            assert cd.up[i] == (1 if ds.up else 0)
            assert cd.info == ds.info
            from_columns = {
                cols.metrics[j]: col[i] for j, col in enumerate(cd.columns) if col is not None and col[i] is not None
            }
            assert from_columns.keys() == ds.values.keys()
            assert all(_same(from_columns[k], v) for k, v in ds.values.items())


VALID = json.loads(codec.encode(make_batch("edge", "boot", [3, 4, 5], 1_700_000_000.0), compress=False))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["delta", "scale", "values", "x"]), inner, max_size=3)
    ),
    max_leaves=20,
)


def _verdict(read: object, data: bytes) -> str:
    try:
        read(data)  # type: ignore[operator]
    except codec.PayloadError:
        return "rejected"
    return "accepted"


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_reader_rejects_exactly_what_the_codec_rejects(data: st.DataObject) -> None:
    doc = json.loads(json.dumps(VALID))
    # replace one part of the document: a top-level field, a device field, or one column
    where = data.draw(st.sampled_from(["top", "device", "column", "delta"]))
    if where == "top":
        doc[data.draw(st.sampled_from(sorted(doc)))] = data.draw(json_values)
    elif where == "device":
        dev = doc["devices"][data.draw(st.integers(0, len(doc["devices"]) - 1))]
        dev[data.draw(st.sampled_from(["id", "up", "info", "columns"]))] = data.draw(json_values)
    else:
        dev = doc["devices"][0]
        j = data.draw(st.integers(0, len(dev["columns"]) - 1))
        if where == "column" or dev["columns"][j] is None or "delta" not in dev["columns"][j]:
            dev["columns"][j] = data.draw(json_values)
        else:
            k = data.draw(st.integers(0, len(dev["columns"][j]["delta"]) - 1))
            dev["columns"][j]["delta"][k] = data.draw(json_values | st.integers(2**52, 2**54))
    raw = json.dumps(doc).encode()
    assert _verdict(columns.read, raw) == _verdict(codec.decode, raw)


@pytest.mark.parametrize("delta", [[2**53, 0, 0], [2**52, 2**52, 0], [1, True, 2], [1.5, 1, 1], [1, None, 1]])
def test_integer_limits_and_types_in_delta_columns_match_the_codec(delta: list[object]) -> None:
    doc = json.loads(json.dumps(VALID))
    doc["devices"][0]["columns"][0] = {"delta": delta}
    raw = json.dumps(doc).encode()
    assert _verdict(columns.read, raw) == _verdict(codec.decode, raw)
