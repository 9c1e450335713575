"""The batch payload: round trip, schema agreement, strict rejection of anything malformed, and
version 1 and 2 payloads still read."""

from __future__ import annotations

import gzip
import json
import math
import zlib
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_exporter import catalog
from gpu_exporter import payload as codec
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, PayloadError, decode, encode, to_document
from gpu_exporter.payload._zdict import ZDICT
from tests.support import paths
from tests.support.payload_helpers import as_v1, as_v2, strictly, v1_payload, v2_payload

VALIDATOR = jsonschema.Draft202012Validator(codec.schema())

# ------------------------------------------------------------------------------------------ strategies

_text = st.text(min_size=1, max_size=12)


@st.composite
def device_ids(draw: st.DrawFn) -> DeviceId:
    gpu = str(draw(st.integers(0, 15)))
    uuid = "GPU-" + draw(st.uuids()).hex
    if draw(st.booleans()):
        return DeviceId(gpu, uuid)
    return DeviceId(
        gpu,
        "MIG-" + draw(st.uuids()).hex,
        gpu_instance=str(draw(st.integers(0, 14))),
        compute_instance=str(draw(st.integers(0, 7))),
        mig_profile=draw(st.sampled_from(["1g.10gb", "2g.20gb", "3g.40gb"])),
        parent_uuid=uuid,
    )


def _series_keys() -> st.SearchStrategy[tuple[str, tuple[str, ...]]]:
    metric = st.sampled_from(catalog.CATALOG)
    return metric.flatmap(lambda m: st.tuples(st.just(m.key), st.tuples(*[_text for _ in m.labels])))


values = st.one_of(
    st.integers(-(2**40), 2**40).map(float),  # counters, bytes, MHz
    st.integers(0, 100).map(lambda v: v / 100),  # NVML percent as a ratio
    st.integers(0, 10**7).map(lambda v: v / 1000),  # milliwatts as watts
    st.floats(allow_nan=True, allow_infinity=True),  # anything at all
)


@st.composite
def batches(draw: st.DrawFn) -> Batch:
    devices = draw(st.lists(device_ids(), min_size=0, max_size=4, unique_by=lambda d: d.uuid))
    infos = {d: draw(st.dictionaries(_text, st.text(max_size=10), max_size=3)) for d in devices}
    n = draw(st.integers(1, 8))
    seq = draw(st.integers(1, 2**40))
    ts_ms = draw(st.integers(0, 4 * 10**12))
    samples = []
    keys = draw(st.lists(_series_keys(), max_size=6, unique=True))
    for _ in range(n):
        present = [d for d in devices if draw(st.integers(0, 9)) > 0]  # devices come and go
        devs = tuple(
            DeviceSample(
                d,
                up=draw(st.booleans()),
                values={k: draw(values) for k in keys if draw(st.booleans())},
                info=infos[d],
            )
            for d in present
        )
        samples.append(Sample(seq=seq, timestamp=ts_ms / 1000, devices=devs))
        seq += draw(st.integers(1, 5))
        ts_ms += draw(st.integers(-10, 10_000))
    node = draw(_text)
    boot = draw(st.uuids()).hex
    return Batch(node, boot, tuple(samples))


def comparable(b: Batch) -> Any:
    """Batch contents with NaN made comparable and the parts that do not travel left out."""

    def val(v: float) -> Any:
        return "nan" if math.isnan(v) else (v, math.copysign(1.0, v))

    return (
        b.node,
        b.boot,
        [
            (
                s.seq,
                round(s.timestamp * 1000),
                sorted(  # devices keep their order unless one joins mid-batch
                    ((d.device, d.up, sorted((k, val(v)) for k, v in d.values.items()), d.info) for d in s.devices),
                    key=lambda t: (t[0].uuid, t[0].gpu),
                ),
            )
            for s in b.samples
        ],
    )


# ------------------------------------------------------------------------------------------ round trip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches(), st.booleans())
def test_round_trip_gives_back_every_value_exactly(b: Batch, compress: bool) -> None:
    data = encode(b, compress=compress)
    if compress:  # zlib (RFC 1950) with the payload's preset dictionary
        assert data[0] == 0x78 and data[1] & 0x20 and data[2:6] == zlib.adler32(ZDICT).to_bytes(4, "big")
    else:
        assert data[:1] == b"{"
    back = decode(data)
    assert comparable(back) == comparable(b)
    assert (back.first_seq, back.last_seq) == (b.first_seq, b.last_seq)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_a_version_1_payload_of_the_same_batch_still_decodes_to_it(b: Batch) -> None:
    doc = to_document(b)
    old = v1_payload(doc)
    assert comparable(decode(old)) == comparable(b)
    VALIDATOR.validate(as_v1(doc))
    codec.verify(old)
    assert codec.peek(old).seqs == tuple(s.seq for s in b.samples)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_a_version_2_payload_of_the_same_batch_still_decodes_to_it(b: Batch) -> None:
    doc = to_document(b)
    old = v2_payload(doc)
    assert old[2:6] != encode(b)[2:6]  # the version 2 preset dictionary, named by its id
    assert comparable(decode(old)) == comparable(b)
    VALIDATOR.validate(as_v2(doc))
    codec.verify(old)
    assert codec.peek(old).version == 2


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_every_encoded_document_matches_the_schema(b: Batch) -> None:
    doc = json.loads(encode(b, compress=False))
    VALIDATOR.validate(doc)


@settings(max_examples=60, deadline=None)
@given(batches())
def test_points_list_each_value_once_with_its_timestamp(b: Batch) -> None:
    points = list(decode(encode(b)).points())
    expected = sum(len(d.values) for s in b.samples for d in s.devices)
    assert len(points) == expected
    by_seq = {s.seq: s for s in b.samples}
    for p in points:
        sample = by_seq[p.seq]
        assert p.timestamp_ms == round(sample.timestamp * 1000)
        (dev,) = [d for d in sample.devices if d.device == p.device]
        orig = dev.values[(p.key, p.labels)]
        assert (math.isnan(orig) and math.isnan(p.value)) or orig == p.value


def _nvml_like_batch(n_samples: int, n_gpus: int = 8) -> Batch:
    samples = []
    for i in range(n_samples):
        devs = []
        for g in range(n_gpus):
            devs.append(
                DeviceSample(
                    DeviceId(str(g), f"GPU-{g:08d}-aaaa-bbbb-cccc-0123456789ab"),
                    True,
                    {
                        ("utilization", ()): ((i * 7 + g) % 101) / 100,
                        ("power", ()): 200 + ((i * 37 + g) % 1000) / 1000,
                        ("memory_used", ()): float(1024**3 + i * 4096),
                        ("temp_gpu", ()): float(50 + (i + g) % 5),
                        ("power_limit", ()): 700.0,
                        ("energy", ()): 1e6 + 1000.5 * i,
                    },
                    {"name": "NVIDIA H100", "driver_version": "550.54.15"},
                )
            )
        samples.append(Sample(100 + i, 1_700_000_000 + 5 * i, tuple(devs)))
    return Batch("edge-a", "b00t", tuple(samples))


def test_device_labels_and_metric_keys_travel_once_per_batch() -> None:
    for n in (1, 12, 120):
        text = encode(_nvml_like_batch(n), compress=False).decode()
        assert text.count("GPU-00000003-aaaa") == 1
        assert text.count('"memory_used"') == 1
        assert text.count("NVIDIA H100") == 8  # info once per device, not per sample


def test_decimal_readings_are_stored_as_scaled_integer_deltas() -> None:
    doc = to_document(_nvml_like_batch(4, n_gpus=1))
    cols = dict(zip((k for k, _ in doc["metrics"]), doc["devices"][0]["columns"], strict=True))
    # [form, (step), deltas...]: form = decimal places + 10 for deltas of deltas + 20 when a step follows
    # power rises 37 mW a sample: its deltas of deltas are written (order 2), in mW (3 places)
    assert cols["power"] == [13, 200000, 37, 0, 0]
    # a common factor travels once: bytes in 4 KiB pages, utilization in steps of 7 %
    assert cols["memory_used"] == [20, 4096, 262144, 1, 1, 1]
    assert cols["utilization"] == [22, 7, 0, 1, 1, 1]
    assert cols["temp_gpu"] == [0, 50, 1, 1, 1]
    assert cols["power_limit"] == 700  # a value that holds still is stated once
    # a counter at a steady rate (1000.5 J a sample): the rate once, then zeros
    assert cols["energy"] == [31, 5, 2000000, 2001, 0, 0]
    assert doc["seq"] == [100, 1, 1, 1]
    assert doc["time_ms"] == [1_700_000_000_000, 5000, 5000, 5000]


def test_a_column_that_moves_with_an_earlier_one_travels_as_a_reference_to_it() -> None:
    total, reserved = 80 * 1024**3, 512 * 1024**2
    samples = []
    for i in range(6):
        used = float(10 * 1024**3 + (i * i * 7919 % 1000) * 2 * 1024**2)
        values = {
            ("memory_used", ()): used,
            ("memory_free", ()): total - reserved - used,
            ("clock_graphics", ()): float(1_410_000_000 + (i * 37 % 11) * 15_000_000),
            ("clock_sm", ()): float(1_410_000_000 + (i * 37 % 11) * 15_000_000),
            ("power", ()): 300 + (i * 7919 % 1000) / 1000,
            ("temp_gpu", ()): 60.0 + i % 3,
        }
        dev = DeviceSample(DeviceId("0", "GPU-a"), True, values)
        samples.append(Sample(i + 1, 1_700_000_000 + 5 * i, (dev,)))
    b = Batch("n", "boot", tuple(samples))
    doc = to_document(b)
    keys = [k for k, _ in doc["metrics"]]
    cols = dict(zip(keys, doc["devices"][0]["columns"], strict=True))
    # free memory is total - reserved - used: the opposite changes of memory_used, and one constant
    assert cols["memory_free"] == {"ref": keys.index("memory_used"), "sign": -1, "add": total - reserved}
    assert cols["clock_sm"] == {"ref": keys.index("clock_graphics")}  # the same clock, stated once
    assert isinstance(cols["power"], list) and isinstance(cols["temp_gpu"], list)  # unrelated: their own deltas
    assert comparable(decode(encode(b))) == comparable(b)
    VALIDATOR.validate(doc)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.integers(-(2**53) + 1, 2**53 - 1) | st.sampled_from([2**53 - 1, -(2**53) + 1, 0]), min_size=1, max_size=6
    )
)
def test_values_near_the_edge_of_exact_json_integers_still_round_trip(ints: list[int]) -> None:
    # deltas between values near +-2**53 would be out of the range a reader accepts: plain values then
    dev = DeviceId("0", "GPU-a")
    samples = tuple(
        Sample(i + 1, 1.0 + i, (DeviceSample(dev, True, {("energy", ()): float(v)}),)) for i, v in enumerate(ints)
    )
    b = Batch("n", "boot", samples)
    assert comparable(decode(encode(b))) == comparable(b)
    VALIDATOR.validate(to_document(b))


def test_a_device_absent_from_some_samples_comes_back_absent() -> None:
    a, b = DeviceId("0", "GPU-a"), DeviceId("1", "GPU-b")
    s1 = Sample(1, 10.0, (DeviceSample(a, True, {("power", ()): 1.5}), DeviceSample(b, True, {})))
    s2 = Sample(2, 15.0, (DeviceSample(a, False, {}),))
    back = decode(encode(Batch("n", "boot", (s1, s2))))
    assert [len(s.devices) for s in back.samples] == [2, 1]
    assert back.samples[1].devices[0].up is False
    assert back.samples[1].devices[0].values == {}


def test_encoding_refuses_a_batch_that_could_not_be_decoded() -> None:
    d = DeviceSample(DeviceId("0", "GPU-a"), True, {})
    with pytest.raises(ValueError, match="at least one sample"):
        encode(Batch("n", "b", ()))
    with pytest.raises(ValueError, match="must increase"):
        encode(Batch("n", "b", (Sample(2, 0.0, (d,)), Sample(2, 1.0, (d,)))))
    with pytest.raises(ValueError, match="node"):
        encode(Batch("", "b", (Sample(1, 0.0, (d,)),)))


# ------------------------------------------------------------------------------------------ rejection


def _valid_doc() -> dict[str, Any]:
    return to_document(_nvml_like_batch(3, n_gpus=2))


def _plain(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _col(column: Any, at: int = 0, v: int = 3) -> Any:
    """A mutation: the first device's column ``at`` becomes ``column``, in a document of version ``v``."""

    def mutate(d: dict[str, Any]) -> None:
        if v < 3:
            d.update(as_v2(d) if v == 2 else as_v1(d))
        d["devices"][0]["columns"][at] = column

    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version=4), "unsupported payload version 4"),
        (lambda d: d.update(version=True), "unsupported payload version"),
        (lambda d: d.update(format="other"), "payload format"),
        (lambda d: d.update(extra=1), "unknown field 'extra'"),
        (lambda d: d.pop("boot"), "lacks boot"),
        (lambda d: d.update(node=""), "node must be"),
        (lambda d: d.update(first_seq=99), "disagree"),
        (lambda d: d.update(seq=[5, 0, 1]), "increase"),
        (lambda d: d.update(seq=[0, 1, 1]), "start at 1"),
        (lambda d: d.update(seq=[]), "at least one sample"),
        (lambda d: d.update(time_ms=[1, 2]), "time_ms has 2 entries"),
        (lambda d: d.update(metrics=[["Bad-Key", []], *d["metrics"][1:]]), "invalid metric key"),
        (lambda d: d["metrics"].append(d["metrics"][0]), "twice"),
        (lambda d: d["devices"][0].update(up=[1, True, 1]), "up entries"),
        (lambda d: d["devices"][0].update(up=[1, 1]), "up must be an array of 3"),
        (lambda d: d["devices"][0]["columns"].pop(), "one per metric"),
        # version 3 columns
        (_col([0, 1, "x", 2]), "integer"),
        (_col([0, 1, 2.5, 2]), "integer"),
        (_col([40, 1, 2, 3]), "starts with its form"),
        (_col([-1, 1, 2, 3]), "starts with its form"),
        (_col([True, 1, 2, 3]), "integer"),
        (_col([]), "starts with its form"),
        (_col([0, 1, 2]), "and 3 deltas"),
        (_col([20, 1, 2, 3]), "the step, and 3 deltas"),
        (_col([20, 0, 1, 2, 3]), "step must be"),
        (_col([20, 2**52, 1, 2, 3]), "out of range"),
        (_col([0, 2**53, 0, 0]), "out of range"),
        (_col([0, 2**52, 2**52, 0]), "out of range"),
        (_col([10, 1, None, 3]), "cannot hold null"),
        (_col([30, 4, 2**50, 2**50, 0]), "out of range"),
        (_col("x"), "invalid value"),
        (_col(True), "invalid value"),
        (_col({"values": [1, "inf", 2]}), "invalid value"),
        (_col({"values": [1, [], 2]}), "invalid value"),
        (_col({"delta": [1, 2, 3]}), "holds values or ref, not delta"),
        (_col({"const": 1}), "holds values or ref, not const"),
        (_col({"ref": 0}), "earlier column"),
        (_col({"ref": 5}, at=1), "earlier column"),
        (_col({"ref": 0, "sign": 2}, at=1), "sign must be 1 or -1"),
        (_col({"ref": 0, "add": "NaN"}, at=1), "add must be a finite number"),
        (_col({"ref": 0, "add": None}, at=1), "add must be a finite number"),
        (_col({"ref": 0, "scale": 2}, at=1), "unknown field 'scale'"),
        (_col({"ref": "0"}, at=1), "integer"),
        # version 2 columns
        (_col({"delta": [1, "x", 2]}, v=2), "integer"),
        (_col({"delta": [1, 2.5, 2]}, v=2), "integer"),
        (_col({"delta": [1, 2, 3], "scale": 12}, v=2), "scale"),
        (_col({"delta": [1, 2, 3], "step": 0}, v=2), "step"),
        (_col({"delta": [1, 2, 3], "step": 2**52}, v=2), "out of range"),
        (_col({"delta": [2**53, 0, 0]}, v=2), "out of range"),
        (_col({"delta": [2**52, 2**52, 0]}, v=2), "out of range"),
        (_col({"values": [1, "inf", 2]}, v=2), "invalid value"),
        (_col({"const": None}, v=2), "const must be a value"),
        (_col({"const": "x"}, v=2), "invalid value"),
        (_col({"const": 1, "scale": 2}, v=2), "unknown field 'scale'"),
        (_col({"delta": [1, 2, 3], "order": 3}, v=2), "order must be"),
        (_col({"delta": [1, None, 3], "order": 2}, v=2), "cannot hold null"),
        (_col({"delta": [2**50, 2**50, 0], "order": 2, "step": 4}, v=2), "out of range"),
        (_col([0, 1, 2, 3], v=2), "must be an object or null"),
        (_col(1, v=2), "must be an object or null"),
        (_col({"ref": 0}, at=1, v=2), "lacks delta"),
        # version 1 columns
        (_col({"const": 1}, v=1), "lacks delta"),
        (_col({"delta": [1, 1, 1], "order": 2}, v=1), "unknown field 'order'"),
        (lambda d: d["devices"][0].update(up=[None, 1, 1]), "absent"),
        (lambda d: d["devices"][1].update(id=d["devices"][0]["id"]), "listed twice"),
        (lambda d: d["devices"][0]["id"].pop("uuid"), "lacks uuid"),
        (lambda d: d["devices"][0].update(info={"name": 3}), "must be a string"),
        (lambda d: d.update(devices={}), "devices must be an array"),
    ],
)
def test_decoder_and_schema_both_reject_malformed_documents(mutate: Any, message: str) -> None:
    doc = _valid_doc()
    mutate(doc)
    with pytest.raises(PayloadError, match=message):
        decode(_plain(doc))
    with pytest.raises(PayloadError, match=message):
        decode(gzip.compress(_plain(doc)))
    structural = message not in (
        "disagree",
        "increase",
        "time_ms has 2 entries",
        "twice",
        "one per metric",
        "up must be an array of 3",
        "absent",
        "listed twice",
        "out of range",
        "start at 1",
        "and 3 deltas",
        "the step, and 3 deltas",
        "earlier column",
    )
    if structural:  # what JSON Schema can express, it expresses too
        assert not VALIDATOR.is_valid(doc)


def test_a_valid_document_passes_both() -> None:
    doc = _valid_doc()
    VALIDATOR.validate(doc)
    assert decode(_plain(doc)).last_seq == 102


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty payload"),
        (b"\x00\x01binary", "not a batch payload"),
        (b"[1,2]", "not a batch payload"),
        (b"{", "not JSON"),
        (b'{"a": NaN}', "non-JSON number NaN"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"\x1f\x8b\x08\x00garbage", "corrupt gzip|truncated"),
        (zlib.compress(b'{"format": "gpu-exporter.batch"}'), "without the preset dictionary"),
        (b"\x78\xbb\x00\x00\x00\x01garbage", "unknown preset dictionary"),
        (b"\x78\xbb", "truncated zlib"),
        (b"{" + b"[" * 100000 + b"]" * 100000 + b"}", "not JSON|nested"),
    ],
)
def test_bytes_that_are_no_payload_are_rejected_with_one_line(data: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message) as info:
        decode(data)
    assert "\n" not in str(info.value)


def test_size_limits_hold_before_and_after_inflating() -> None:
    data = encode(_nvml_like_batch(50))
    with pytest.raises(PayloadError, match="exceeds the 100-byte limit"):
        decode(data, max_bytes=100)
    inflated = b'{"format":"gpu-exporter.batch","version":2,' + b" " * 5_000_000 + b"}"
    bomb = gzip.compress(inflated)
    deflater = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, ZDICT)
    zbomb = deflater.compress(inflated) + deflater.flush()
    for packed in (bomb, zbomb):
        assert len(packed) < 10_000
        with pytest.raises(PayloadError, match="inflates beyond"):
            decode(packed, max_bytes=1_000_000)
        with pytest.raises(PayloadError, match="inflates beyond"):
            codec.verify(packed, max_bytes=1_000_000)
    with pytest.raises(PayloadError, match="truncated"):
        decode(data[:-20])
    with pytest.raises(PayloadError, match="trailing bytes"):
        decode(data + b"x")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_payload_error_or_decode(data: bytes) -> None:
    for reader in (decode, codec.peek, codec.verify):
        strictly(reader, data)  # a deliberate refusal, not an IndexError wrapped into PayloadError


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_corrupted_payloads_raise_only_payload_error(data: st.DataObject) -> None:
    good = bytearray(encode(_nvml_like_batch(3, n_gpus=2), compress=data.draw(st.booleans())))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(good) - 1))
        good[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(good)))
    for reader in (decode, codec.peek, codec.verify):
        strictly(reader, bytes(good[:cut]))


def test_json_values_of_the_wrong_kind_never_escape_as_other_errors() -> None:
    doc = _valid_doc()
    for field in doc:
        for bad in (None, "x", 1.5, [], {}, [None], [[]], 10**400):
            mutated = dict(doc, **{field: bad})
            strictly(decode, _plain(mutated))


@settings(max_examples=60, deadline=None)
@given(batches())
def test_peek_reads_the_header_decode_would(b: Batch) -> None:
    data = encode(b)
    head = codec.peek(data)
    assert (head.node, head.boot) == (b.node, b.boot)
    assert head.seqs == tuple(s.seq for s in b.samples)
    assert (head.first_seq, head.last_seq) == (b.first_seq, b.last_seq)


def test_peek_and_verify_reject_what_breaks_in_a_damaged_file() -> None:
    data = encode(_nvml_like_batch(5))
    codec.verify(data)
    codec.verify(encode(_nvml_like_batch(5), compress=False))
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    for bad in (data[: len(data) // 2], data[:-4] + b"\0\0\0\0", b"\x1f\x8b" + b"\0" * 40, bytes(flipped)):
        for reader in (codec.peek, codec.verify):
            with pytest.raises(PayloadError):
                reader(bad)
    with pytest.raises(PayloadError, match="not a batch written by this encoder"):
        codec.verify(gzip.compress(b'{"format":"something-else"}'))


def test_the_example_in_docs_payload_md_is_a_valid_batch() -> None:
    text = (paths.ROOT / "docs" / "payload.md").read_text()
    example = text.split("```json\n", 1)[1].split("```", 1)[0]
    doc = json.loads(example)
    VALIDATOR.validate(doc)
    batch = decode(example.encode())
    assert batch.samples[2].devices[0].values[("power", ())] == 244.0
    assert batch.samples[2].devices[0].values[("power_limit", ())] == 700.0
    assert batch.samples[2].devices[0].values[("energy", ())] == 5000125.2
    used, free = (batch.samples[1].devices[0].values[(k, ())] for k in ("memory_used", "memory_free"))
    assert used == 8 * 2**30 + 9000 * 4096 and used + free == 40 * 2**30 - 592 * 2**20  # free refers to used


def test_the_preset_dictionaries_are_frozen_with_their_versions() -> None:
    # A zlib payload names its dictionary by Adler-32: an edited dictionary is one that batches already
    # spooled or in flight (and readers already deployed) do not have.
    from gpu_exporter.payload._zdict import ZDICT_V2

    assert zlib.adler32(ZDICT) == 0x408D87D3
    assert zlib.adler32(ZDICT_V2) == 0xC154942C


def test_a_version_1_payload_as_sent_by_earlier_agents_decodes() -> None:
    v1 = {
        "format": "gpu-exporter.batch",
        "version": 1,
        "node": "edge-gpu-07",
        "boot": "4b8e0f5c2d9a4f64a1f3b2e1c0d9e8f7",
        "first_seq": 1201,
        "last_seq": 1203,
        "seq": [1201, 1, 1],
        "time_ms": [1764412800000, 5000, 5001],
        "metrics": [["utilization", []], ["power", []], ["clock_event_reason", ["sw_power_cap"]]],
        "devices": [
            {
                "id": {"gpu": "0", "uuid": "GPU-8f1c6f0e-6c7b-4d2d-9a57-0a1b2c3d4e5f"},
                "info": {"name": "NVIDIA A100-SXM4-40GB", "driver_version": "550.54.15"},
                "up": [1, 1, 1],
                "columns": [
                    {"scale": 2, "delta": [37, 4, -1]},
                    {"scale": 3, "delta": [245123, 877, -2000]},
                    {"delta": [0, 0, 1]},
                ],
            }
        ],
    }
    VALIDATOR.validate(v1)
    data = gzip.compress(json.dumps(v1, separators=(",", ":")).encode())
    codec.verify(data)
    batch = decode(data)
    assert [s.timestamp for s in batch.samples] == [1764412800.0, 1764412805.0, 1764412810.001]
    assert [s.devices[0].values[("power", ())] for s in batch.samples] == [245.123, 246.0, 244.0]
    assert batch.samples[2].devices[0].values[("clock_event_reason", ("sw_power_cap",))] == 1.0


_EDGES = {("power", ()): -0.0, ("energy", ()): 2.0**53, ("temp_gpu", ()): -3.0, ("utilization", ()): math.nan}


@given(batches())
@example(Batch("n", "b" * 32, (Sample(1, 1.0, (DeviceSample(DeviceId("0", "GPU-0"), False, _EDGES, {"k": ""}),)),)))
def test_a_one_sample_batch_takes_the_short_path_to_the_same_document(b: Batch) -> None:
    """The spool's journal encodes one sample a cycle through a path of its own (payload/encode.py,
    ``_one_sample``): for any sample it must write what the general path writes, byte for byte (-0.0,
    integers, non-finite values, absent series, info included)."""
    import importlib

    from gpu_exporter.payload import types as fmt

    enc = importlib.import_module("gpu_exporter.payload.encode")  # the module: the package exports its function

    one = b.samples[:1]
    fast_index: dict[Any, int] = {}
    general_index: dict[Any, int] = {}
    fast = enc._one_sample(one, fast_index, fmt.KEY)
    general = enc._samples(one, general_index, fmt.KEY)
    assert json.dumps(fast) == json.dumps(general)
    assert list(fast_index) == list(general_index)
