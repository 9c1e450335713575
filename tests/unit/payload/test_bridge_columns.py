"""The bridge's columnar reader accepts exactly what the payload codec accepts, with the same values."""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter import catalog
from gpu_exporter import payload as codec
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import columns
from gpu_exporter.payload._zdict import ZDICT
from gpu_exporter.payload.document import read_column
from tests.support.bridge_helpers import make_batch
from tests.support.payload_helpers import as_v1, as_v2, v1_payload, v2_payload

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
VALID_V2 = as_v2(VALID)
VALID_V1 = as_v1(VALID)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.lists(st.integers(-3, 45), min_size=3, max_size=6)  # near a version 3 delta array
        | st.dictionaries(
            st.sampled_from(["delta", "scale", "step", "order", "const", "values", "ref", "sign", "add", "x"]),
            inner,
            max_size=3,
        )
    ),
    max_leaves=20,
)


def _verdict(read: object, data: bytes) -> str:
    try:
        read(data)  # type: ignore[operator]
    except codec.PayloadError as exc:
        # a refusal by the reader's own checks; "invalid payload: IndexError: ..." is a bug it wrapped
        assert not str(exc).startswith("invalid payload:"), exc
        return "rejected"
    return "accepted"


@pytest.fixture(params=["orjson", "json"])
def parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The reader with orjson (when installed) and with the standard library."""
    if request.param == "orjson":
        if columns._orjson is None:
            pytest.skip("orjson is not installed")
    else:
        monkeypatch.setattr(columns, "_orjson", None)
    return str(request.param)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_the_reader_rejects_exactly_what_the_codec_rejects(parser: str, data: st.DataObject) -> None:
    doc = json.loads(json.dumps(data.draw(st.sampled_from([VALID, VALID_V2, VALID_V1]))))
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
        col = dev["columns"][j]
        deltas = col if isinstance(col, list) else col.get("delta") if isinstance(col, dict) else None
        if where == "column" or not deltas:
            dev["columns"][j] = data.draw(json_values)
        else:  # one entry of a delta column (in version 3, possibly its form or step)
            k = data.draw(st.integers(0, len(deltas) - 1))
            deltas[k] = data.draw(json_values | st.integers(2**52, 2**54) | st.integers(-2, 41))
    raw = json.dumps(doc).encode()
    assert _verdict(columns.read, raw) == _verdict(codec.decode, raw)


@pytest.mark.parametrize(
    "column",
    [
        {"delta": [2**53, 0, 0]},
        {"delta": [2**52, 2**52, 0]},
        {"delta": [1, True, 2]},
        {"delta": [1.5, 1, 1]},
        {"delta": [1, None, 1]},
        {"delta": [0, 0, 0], "step": 2**53},
        {"delta": [2**40, 0, 0], "step": 2**13},
        {"delta": [2**40, 0, 0], "step": 2**12, "scale": 3},
        {"delta": [1, 1, 1], "step": 0},
        {"delta": [1, 1, 1], "step": True},
        {"delta": [1, 1, 1], "scale": 10},
        {"delta": [1, 1, 1], "order": 2},
        {"delta": [1, 1, 1], "order": 1},
        {"delta": [1, 1, 1], "order": 3},
        {"delta": [1, 1, 1], "order": True},
        {"delta": [1, None, 1], "order": 2},
        {"delta": [2**50, 2**50, 0], "order": 2, "step": 4},
        {"delta": [2**50, 2**49, -(2**49)], "order": 2, "step": 4},
        {"delta": [2**51, -(2**51), 2**51], "order": 2},
        {"delta": [5, 3, -1], "order": 2, "step": 1000, "scale": 3},
        {"const": 1},
        {"const": "NaN"},
        {"const": None},
        {"const": True},
        {"const": 1, "step": 2},
    ],
)
@pytest.mark.parametrize("version", [1, 2, 3])
def test_integer_limits_and_types_in_delta_columns_match_the_codec(
    parser: str, column: dict[str, object], version: int
) -> None:
    _check_column_verdict({1: VALID_V1, 2: VALID_V2, 3: VALID}[version], column, version)


@pytest.mark.parametrize(
    "column",
    [
        [0, 2**53, 0, 0],
        [0, 2**52, 2**52, 0],
        [0, 1, True, 2],
        [0, True, 1, 2],
        [10, 1, 1, True],  # second order: summing once would hide the boolean
        [30, 4, 1, 1, True],
        [10, 1, 1.0, 1],
        [0, 2**51, 2**51, 0],  # values past the reader's own bound of 2**51, within the codec's
        [20, 3, 2**50, 0, 0],
        [0, 2**52, -(2**52), 2**52],
        [0, 1, None, 1],
        [20, 2**53, 0, 0, 0],
        [20, 2**13, 2**40, 0, 0],
        [23, 2**12, 2**40, 0, 0],
        [20, 0, 1, 1, 1],
        [20, True, 1, 1, 1],
        [20, 1, 1, 1],
        [40, 1, 1, 1],
        [-1, 1, 1, 1],
        [1.0, 1, 1, 1],
        [None, 1, 1, 1],
        [],
        [10, 1, 1, 1],
        [10, 1, None, 1],
        [30, 4, 2**50, 2**50, 0],
        [30, 4, 2**50, 2**49, -(2**49)],
        [10, 2**51, -(2**51), 2**51],
        [33, 1000, 5, 3, -1],
        [0, 1, 1, 1, 1],
        1,
        -2.5,
        "NaN",
        "+Inf",
        "x",
        True,
        {"values": [1, 2.5, None]},
        {"values": [1, 2, 3], "x": 1},
        {"ref": 0},
        {"delta": [1, 1, 1]},
        {"const": 1},
    ],
)
def test_version_3_columns_match_the_codec(parser: str, column: object) -> None:
    _check_column_verdict(VALID, column, 3)


def _check_column_verdict(valid: dict[str, object], column: object, version: int) -> None:
    doc = json.loads(json.dumps(valid))
    doc["devices"][0]["columns"][0] = column
    raw = json.dumps(doc).encode()
    assert _verdict(columns.read, raw) == _verdict(codec.decode, raw)
    if _verdict(codec.decode, raw) == "accepted":
        assert columns.read(raw).devices[0].columns[0] == read_column("c", column, 3, version)


@pytest.mark.parametrize("at", [0, 1, 2, 4])
@pytest.mark.parametrize("ref", [{"ref": 0}, {"ref": 1, "sign": -1, "add": 7}, {"ref": 3, "add": 0.5}, {"ref": -1}])
def test_references_resolve_as_the_codec_resolves_them(parser: str, at: int, ref: dict[str, object]) -> None:
    doc = json.loads(json.dumps(VALID))
    doc["devices"][0]["columns"][at] = ref
    raw = json.dumps(doc).encode()
    assert _verdict(columns.read, raw) == _verdict(codec.decode, raw)
    if _verdict(codec.decode, raw) == "accepted":
        objects = codec.decode(raw)
        cols = columns.read(raw)
        key = cols.metrics[at]
        assert cols.devices[0].columns[at] == [s.devices[0].values.get(key) for s in objects.samples]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"format": "gpu-exporter.batch", "version": NaN}',
        b'{"format": "gpu-exporter.batch", "version": 1e999}',
        b'{"format": "gpu-exporter.batch", "version": 123456789012345678901234567890}',
        b'{"format": "gpu-exporter.batch", "version": 1, "x": "\xff"}',
        b"{" * 5000,
        b'{"format": "gpu-exporter.batch", "version": 1} trailing',
    ],
)
def test_odd_json_is_rejected_by_both_parsers_as_by_the_codec(parser: str, raw: bytes) -> None:
    assert _verdict(columns.read, raw) == _verdict(codec.decode, raw) == "rejected"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches())
def test_both_parsers_read_the_same_columns(parser: str, batch: codec.Batch) -> None:
    data = codec.encode(batch)
    cols = columns.read(data)
    for old_payload in (v1_payload, v2_payload):  # what agents of payload versions 1 and 2 sent
        old = columns.read(old_payload(codec.to_document(batch)))
        assert [_nan_safe(d.columns) for d in old.devices] == [_nan_safe(d.columns) for d in cols.devices]
    objects = codec.decode(data)
    assert cols.seqs == [s.seq for s in objects.samples]
    assert sum(sum(v is not None for v in c) for d in cols.devices for c in d.columns if c is not None) == sum(
        len(ds.values) for s in objects.samples for ds in s.devices
    )


def _nan_safe(cols: list[list[float | None] | None]) -> list[object]:
    return [None if c is None else [("nan",) if v is not None and math.isnan(v) else v for v in c] for c in cols]


# -------------------------------------------------------------------------- real batches and mutations


def _fleet_documents() -> list[dict[str, object]]:
    """Documents of simulated 8-GPU nodes as agents send them (the fleet bench's templates: the fake
    NVML backend, rounded and encoded by the agent's own code), batches of 24 samples and of 1."""
    import sys

    from tests.support import paths

    sys.path.insert(0, str(paths.ROOT / "bench"))
    from fleet_payloads import Templates

    docs = []
    for per_batch, count in ((24, 2), (1, 2)):
        templates = Templates(gpus=8, per_batch=per_batch, count=count)
        for node in range(count):
            message = templates.message(node, f"edge-{node}", "boot", 1 + per_batch * node, 1_700_000_000_000)
            docs.append(json.loads(zlib.decompressobj(zdict=ZDICT).decompress(message.payload)))
    return docs


FLEET = _fleet_documents()
ODD = [None, True, False, 0, -1, 1.5, -0.0, 2**31, 2**51, 2**53, -(2**53), 2**62, 10**20, "NaN", "x", [], [1], {}]


def _mutated(rng: random.Random, doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with one column of one device changed: an entry of a delta array (its form, step or a
    delta) replaced or scaled up, the column replaced, or a reference to another column."""
    doc = copy.deepcopy(doc)
    dev = rng.choice(doc["devices"])
    j = rng.randrange(len(dev["columns"]))
    col = dev["columns"][j]
    what = rng.randrange(4)
    if what < 2 and isinstance(col, list) and col:
        k = rng.randrange(len(col))
        col[k] = (
            rng.choice(ODD) if what == 0 or type(col[k]) is not int else col[k] * rng.choice([2**20, 2**30, -(10**9)])
        )
    elif what == 2:
        dev["columns"][j] = {"ref": rng.randrange(-1, j + 2), "sign": rng.choice([1, -1, 2]), "add": rng.choice(ODD)}
    else:
        dev["columns"][j] = rng.choice(ODD)
    return doc


@pytest.mark.parametrize("doc", FLEET, ids=lambda d: f"{len(d['seq'])}-sample")  # type: ignore[index]
def test_real_batches_read_as_the_codec_decodes_them(parser: str, doc: dict[str, Any]) -> None:
    """What agents send, in every payload version: the same values as the codec, and counters said to
    be rising (which spares the value policy a pass) do not go down."""
    counters = [j for j, (key, _) in enumerate(doc["metrics"]) if key in catalog.COUNTER_KEYS]  # type: ignore[union-attr]
    for version in (doc, as_v2(doc), as_v1(doc)):
        raw = json.dumps(version).encode()
        cols, objects = columns.read(raw), codec.decode(raw)
        for dev in cols.devices:
            for i, sample in enumerate(objects.samples):
                (ds,) = [d for d in sample.devices if d.device == dev.device]
                got = {cols.metrics[j]: c[i] for j, c in enumerate(dev.columns) if c is not None and c[i] is not None}
                assert got == ds.values
            if dev.counters_rising:
                for j in counters:
                    col = dev.columns[j]
                    assert col is None or all(a <= b for a, b in itertools.pairwise(col))  # type: ignore[operator]


def test_mutated_real_batches_are_refused_in_the_codecs_words(parser: str) -> None:
    """Real documents with one column changed (300 of them, seeded): the reader accepts exactly what
    the codec accepts, with the same values, and refuses the rest with the codec's own message (with
    orjson, an integer beyond 64 bits is a float, so only the verdict is compared there)."""
    rng = random.Random(22)
    refused = 0
    for _ in range(300):
        doc = _mutated(rng, rng.choice(FLEET[:2]))
        raw = json.dumps(doc).encode()
        try:
            expected = codec.decode(raw)
        except codec.PayloadError as exc:
            refused += 1
            with pytest.raises(codec.PayloadError) as got:
                columns.read(raw)
            if parser == "json":
                assert str(got.value) == str(exc)
            continue
        cols = columns.read(raw)
        for dev in cols.devices:
            (ds,) = [d for d in expected.samples[0].devices if d.device == dev.device]
            got_values = {
                cols.metrics[j]: c[0] for j, c in enumerate(dev.columns) if c is not None and c[0] is not None
            }
            assert got_values.keys() == ds.values.keys()
            assert all(_same(got_values[k], v) for k, v in ds.values.items())
    assert 50 < refused < 250  # both kinds were tried
