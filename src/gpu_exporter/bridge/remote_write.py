"""Prometheus remote write 1.0: a WriteRequest encoded by hand, snappy block compression.

The message is small enough that a protobuf runtime would cost more than it saves::

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // timestamp in milliseconds

Series from one batch share their timestamps (the payload is columnar), so the encoder caches the
timestamp varints per request and the encoded label block per series across requests, and packs each
series' samples with one ``struct`` call.
"""

from __future__ import annotations

import bisect
import itertools
import operator
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import cramjam

__all__ = [
    "HEADERS",
    "LabelSet",
    "Series",
    "WriteEncoder",
    "compress",
    "encode_labels",
    "encode_varint",
    "split_by_samples",
    "split_by_time",
]

# (name, value) pairs; the encoder sorts them by name as the spec requires.
LabelSet = tuple[tuple[str, str], ...]

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}


@dataclass(slots=True)
class Series:
    """One time series of a request: samples in time order, timestamps in milliseconds.

    ``encoded_labels``, when given, is the series' Label fields already encoded (``encode_labels``) and
    replaces ``labels``, which may then be empty.
    """

    labels: LabelSet
    timestamps: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    encoded_labels: bytes = b""  # the Label fields of ``labels`` if the caller has them cached

    def __len__(self) -> int:
        return len(self.timestamps)


def encode_varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes (two's complement), as protobuf does."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = tuple(encode_varint(i) for i in range(1 << 14))  # lengths of most messages: one lookup
_TS_HEAD = tuple(b"\x0a" + v for v in _SMALL)  # WriteRequest field 1 (a TimeSeries) of that length


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + encode_varint(len(payload)) + payload


def encode_labels(labels: LabelSet) -> bytes:
    """The Label fields of a TimeSeries, sorted by name."""
    parts = []
    for name, value in sorted(labels):
        body = _field(0x0A, name.encode()) + _field(0x12, value.encode())
        parts.append(_field(0x0A, body))
    return b"".join(parts)


class WriteEncoder:
    """Builds WriteRequest bodies. Not thread-safe: one encoder per writer thread."""

    def __init__(self, label_cache_size: int = 200_000) -> None:
        self._labels: dict[LabelSet, bytes] = {}
        self._label_cache_size = label_cache_size
        self._plans: dict[tuple[int, ...], tuple[list[object], struct.Struct, int]] = {}
        # the bytes around a sample's double, by timestamp: a fleet's writes repeat recent timestamps
        self._around: dict[int, tuple[bytes, bytes]] = {}

    def _label_block(self, labels: LabelSet) -> bytes:
        block = self._labels.get(labels)
        if block is None:
            if len(self._labels) >= self._label_cache_size:
                self._labels.clear()
            block = self._labels[labels] = encode_labels(labels)
        return block

    def encode(self, series: Iterable[Series]) -> bytes:
        """The uncompressed protobuf body for ``series``."""
        # One sample is: 0x12 <len> 0x09 <8-byte double> 0x10 <varint ms>. Everything but the double
        # depends on the timestamp only, so the bytes around each double are built once per timestamp,
        # and series that share one timestamp list (all series of a batch, which come one after another)
        # are packed CHUNK at a time by one ``struct`` call: a series costs a few list operations.
        around = self._around
        if len(around) > 100_000:
            around.clear()
        out: list[bytes] = []
        for _, run in itertools.groupby(series, key=_STAMPS):
            group = list(run)
            stamps = group[0].timestamps
            if not stamps:
                continue
            template, chunk, size = self._plan(stamps, around)
            step = len(template) // CHUNK  # struct arguments per series
            labels = [s.encoded_labels or self._label_block(s.labels) for s in group]
            bodies: list[memoryview | bytes] = []
            for lo in range(0, len(group), CHUNK):
                part = group[lo : lo + CHUNK]
                k = len(part)
                args = template[: k * step] if k < CHUNK else template.copy()
                args[1::3] = list(itertools.chain.from_iterable([s.values for s in part]))
                packed = memoryview(
                    chunk.pack(*args)
                    if k == CHUNK
                    else struct.pack(chunk.format[: 1 + len(chunk.format[1:]) * k // CHUNK], *args)
                )
                bodies += [packed[i : i + size] for i in range(0, k * size, size)]
            heads = [
                _TS_HEAD[n] if n < 16384 else b"\x0a" + encode_varint(n) for n in map(size.__add__, map(len, labels))
            ]
            out += itertools.chain.from_iterable(zip(heads, labels, bodies, strict=True))  # type: ignore[arg-type]
        return b"".join(out)

    def _plan(
        self, stamps: list[int], around: dict[int, tuple[bytes, bytes]]
    ) -> tuple[list[object], struct.Struct, int]:
        """The struct arguments (values left 0.0) and the Struct of CHUNK series with these timestamps,
        and the size of one series' samples."""
        key = tuple(stamps)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        one: list[object] = []
        fmt = []
        for ts in stamps:
            pair = around.get(ts)
            if pair is None:
                tail = b"\x10" + encode_varint(ts)
                head = b"\x12" + encode_varint(9 + len(tail)) + b"\x09"
                pair = around[ts] = (head, tail)
            one += (pair[0], 0.0, pair[1])
            fmt.append(f"{len(pair[0])}sd{len(pair[1])}s")
        single = "".join(fmt)
        chunk = struct.Struct("<" + single * CHUNK)
        if len(self._plans) >= 256:
            self._plans.clear()
        plan = self._plans[key] = (one * CHUNK, chunk, struct.calcsize("<" + single))
        return plan


CHUNK = 16  # series packed by one struct call


_STAMPS = operator.attrgetter("timestamps")  # series with equal timestamp lists share a plan


def compress(body: bytes) -> bytes:
    """Snappy block format (not the framed stream format), as remote write requires."""
    return bytes(cramjam.snappy.compress_raw(body))


def split_by_samples(series: Sequence[Series], max_samples: int) -> list[list[Series]]:
    """Cut ``series`` into requests of at most ``max_samples`` samples.

    Whole series go together (a series' samples stay in time order within one request); only a series
    longer than ``max_samples`` is itself cut along time, oldest part first.
    """
    requests: list[list[Series]] = []
    chunk: list[Series] = []
    size = 0
    for s in series:
        n = len(s.timestamps)
        if not n:
            continue
        if n > max_samples:
            memo: dict[tuple[int, int, int], list[int]] = {}
            for lo in range(0, n, max_samples):
                part = _slice_positions(s, lo, min(n, lo + max_samples), memo)
                if size + len(part) > max_samples and chunk:
                    requests.append(chunk)
                    chunk, size = [], 0
                chunk.append(part)
                size += len(part)
            continue
        if size + n > max_samples and chunk:
            requests.append(chunk)
            chunk, size = [], 0
        chunk.append(s)
        size += n
    if chunk:
        requests.append(chunk)
    return requests


def split_by_time(series: Sequence[Series]) -> tuple[list[Series], list[Series]] | None:
    """Halve a request along time (older half first); None when it holds a single timestamp."""
    stamps = sorted({ts for s in series for ts in s.timestamps})
    if len(stamps) < 2:
        return None
    middle = stamps[len(stamps) // 2]
    memo: dict[tuple[int, int, int], list[int]] = {}
    older = [p for p in (_slice(s, None, middle, memo) for s in series) if len(p)]
    newer = [p for p in (_slice(s, middle, None, memo) for s in series) if len(p)]
    return older, newer


def _slice_positions(s: Series, lo: int, hi: int, memo: dict[tuple[int, int, int], list[int]]) -> Series:
    key = (id(s.timestamps), lo, hi)
    stamps = memo.get(key)
    if stamps is None:
        stamps = memo[key] = s.timestamps[lo:hi]
    return Series(s.labels, stamps, s.values[lo:hi], s.encoded_labels)


def _slice(s: Series, lower: int | None, upper: int | None, memo: dict[tuple[int, int, int], list[int]]) -> Series:
    """The part of ``s`` in [lower, upper). Series that shared a timestamp list share the sliced one."""
    lo = 0 if lower is None else bisect.bisect_left(s.timestamps, lower)
    hi = len(s.timestamps) if upper is None else bisect.bisect_left(s.timestamps, upper)
    if lo == 0 and hi == len(s.timestamps):
        return s
    key = (id(s.timestamps), lo, hi)
    stamps = memo.get(key)
    if stamps is None:
        stamps = memo[key] = s.timestamps[lo:hi]
    return Series(s.labels, stamps, s.values[lo:hi], s.encoded_labels)
