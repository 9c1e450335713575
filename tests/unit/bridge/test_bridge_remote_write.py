"""The remote-write encoder: protobuf bytes a receiver can read, snappy block format, splitting."""

from __future__ import annotations

import math

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_exporter.bridge.remote_write import (
    HEADERS,
    Series,
    WriteEncoder,
    compress,
    encode_varint,
    split_by_samples,
    split_by_time,
)
from tests.support.bridge_helpers import decode_write_request


def test_write_request_round_trips_with_sorted_labels_and_exact_values() -> None:
    shared = [1_700_000_000_000, 1_700_000_005_000, 1_700_000_010_000]
    series = [
        Series((("node", "edge-1"), ("__name__", "gpu_power_watts"), ("gpu", "0")), shared, [1.5, 2.25, 3.0]),
        Series(
            (("__name__", "gpu_temperature_celsius"), ("sensor", "gpu"), ("uuid", "GPU-é✓")),
            shared,
            [math.inf, -0.0, 1e300],
        ),
        Series((("__name__", "x"),), [-5, 0, 2**62], [1, 2, 3]),
        Series((("__name__", "empty"),), [], []),
    ]
    decoded = decode_write_request(WriteEncoder().encode(series))
    assert decoded == [
        (
            [("__name__", "gpu_power_watts"), ("gpu", "0"), ("node", "edge-1")],
            [(1_700_000_000_000, 1.5), (1_700_000_005_000, 2.25), (1_700_000_010_000, 3.0)],
        ),
        (
            [("__name__", "gpu_temperature_celsius"), ("sensor", "gpu"), ("uuid", "GPU-é✓")],
            [(1_700_000_000_000, math.inf), (1_700_000_005_000, -0.0), (1_700_000_010_000, 1e300)],
        ),
        ([("__name__", "x")], [(-5, 1.0), (0, 2.0), (2**62, 3.0)]),
    ]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=12), min_size=1, max_size=4),
            st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False)), max_size=20),
        ),
        max_size=6,
    )
)
def test_encoder_agrees_with_an_independent_decoder(
    raw: list[tuple[dict[str, str], list[tuple[int, float]]]],
) -> None:
    series = []
    for labels, points in raw:
        points = sorted(dict(points).items())
        series.append(Series(tuple(labels.items()), [t for t, _ in points], [v for _, v in points]))
    decoded = decode_write_request(WriteEncoder().encode(series))
    expected = [(sorted(s.labels), list(zip(s.timestamps, s.values, strict=True))) for s in series if len(s)]
    assert decoded == expected


def test_varint_matches_protobuf_rules() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(1) == b"\x01"
    assert encode_varint(300) == b"\xac\x02"
    assert encode_varint(-1) == b"\xff" * 9 + b"\x01"


def test_compression_is_the_snappy_block_format_and_headers_follow_the_spec() -> None:
    body = WriteEncoder().encode([Series((("__name__", "m"),), list(range(1000)), [1.0] * 1000)])
    packed = compress(body)
    assert not packed.startswith(b"\xff\x06\x00\x00sNaPpY")  # not the framed stream format
    assert bytes(cramjam.snappy.decompress_raw(packed)) == body
    assert len(packed) < len(body)
    assert HEADERS == {
        "Content-Encoding": "snappy",
        "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }


def _points(requests: list[list[Series]]) -> set[tuple[tuple[tuple[str, str], ...], int, float]]:
    return {(s.labels, t, v) for r in requests for s in r for t, v in zip(s.timestamps, s.values, strict=True)}


def test_large_writes_are_split_into_bounded_requests_keeping_series_whole() -> None:
    stamps = list(range(0, 40_000, 1000))
    series = [Series((("__name__", f"m{i}"),), stamps, [float(i)] * len(stamps)) for i in range(30)]
    requests = split_by_samples(series, 250)
    assert all(sum(len(s) for s in r) <= 250 for r in requests)
    assert sum(sum(len(s) for s in r) for r in requests) == 1200
    assert _points(requests) == _points([series])
    names = [s.labels for r in requests for s in r]
    assert len(names) == len(set(names)) == 30  # no series cut in two


def test_a_series_longer_than_a_request_is_cut_along_time_oldest_first() -> None:
    long = Series((("__name__", "long"),), list(range(1000)), [float(i) for i in range(1000)])
    short = Series((("__name__", "short"),), [5], [1.0])
    requests = split_by_samples([short, long], 300)
    assert all(sum(len(s) for s in r) <= 300 for r in requests)
    assert _points(requests) == _points([[short, long]])
    parts = [s for r in requests for s in r if s.labels == long.labels]
    assert [p.timestamps[0] for p in parts] == [0, 300, 600, 900]
    assert all(p.timestamps == sorted(p.timestamps) for p in parts)


def test_split_by_time_halves_and_stops_at_one_timestamp() -> None:
    series = [Series((("__name__", "m"),), [1, 2, 3, 4], [1.0, 2.0, 3.0, 4.0])]
    halves = split_by_time(series)
    assert halves is not None
    older, newer = halves
    assert older[0].timestamps == [1, 2] and newer[0].timestamps == [3, 4]
    assert split_by_time([Series((("__name__", "m"),), [7], [1.0])]) is None


@pytest.mark.parametrize(
    "stamps",
    [
        [1_700_000_000_000 + 5000 * i for i in range(24)],  # one batch: varints of one length
        [120, 127, 128, 16_383, 16_384, 2**40],  # varints of several lengths
        [1_700_000_000_000],
    ],
)
def test_series_that_share_a_timestamp_list_are_written_together_value_for_value(stamps: list[int]) -> None:
    """A batch's series share one timestamp list and are packed together: each keeps its own values,
    ints and floats alike, in its own TimeSeries."""
    values = [
        [float(i * 1000 + k) if i % 2 else i * 1000 + k for k in range(len(stamps))]  # ints from the decoder too
        for i in range(40)
    ]
    values[3] = [math.nan if k % 2 else -0.0 for k in range(len(stamps))]
    series = [Series((("__name__", f"m{i}"), ("gpu", str(i % 8))), stamps, v) for i, v in enumerate(values)]
    decoded = decode_write_request(WriteEncoder().encode(series))
    assert [labels for labels, _ in decoded] == [sorted(s.labels) for s in series]
    for (_, points), s in zip(decoded, series, strict=True):
        assert [t for t, _ in points] == stamps
        got = [v for _, v in points]
        assert [math.copysign(1, v) if v == 0 else v for v in got if v == v] == [
            math.copysign(1, v) if v == 0 else v for v in s.values if v == v
        ]
        assert sum(v != v for v in got) == sum(v != v for v in s.values)
