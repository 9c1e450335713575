"""Prometheus remote write 1.0: a WriteRequest encoded by hand, snappy block compression.

The message is small enough that a protobuf runtime would cost more than it saves::

    WriteRequest { repeated TimeSeries timeseries = 1; }
    TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2; }
    Label        { string name = 1; string value = 2; }
    Sample       { double value = 1; int64 timestamp = 2; }   // timestamp in milliseconds

Series from one batch share their timestamps (the payload is columnar), so the encoder caches the
bytes around each sample's value per timestamp list and the encoded label block per series across
requests, and writes the values of all series with one timestamp list by a few C-level copies.
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
        self._plans: dict[tuple[int, ...], _Plan] = {}
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
        # depends on the timestamp only, so the samples of a series are a template per timestamp list
        # with the doubles written in. Series that share one timestamp list (all series of a batch,
        # which come one after another) are written together: their values packed as doubles by one
        # C-level conversion, and, where every sample of the list takes the same number of bytes (the
        # usual case: timestamps of one era have varints of one length), copied into the repeated
        # template by eight strided byte copies, one per byte of a double. A series costs a few list
        # operations, a value none in Python.
        around = self._around
        if len(around) > 100_000:
            around.clear()
        out: list[bytes | memoryview] = []
        for _, run in itertools.groupby(series, key=_STAMPS):
            group = list(run)
            stamps = group[0].timestamps
            if not stamps:
                continue
            plan = self._plan(stamps, around)
            labels = [s.encoded_labels or self._label_block(s.labels) for s in group]
            bodies = plan.bodies([s.values for s in group])
            size = plan.size
            heads = [
                _TS_HEAD[n] if n < 16384 else b"\x0a" + encode_varint(n) for n in map(size.__add__, map(len, labels))
            ]
            out += itertools.chain.from_iterable(zip(heads, labels, bodies, strict=True))
        return b"".join(out)

    def _plan(self, stamps: list[int], around: dict[int, tuple[bytes, bytes]]) -> _Plan:
        key = tuple(stamps)
        plan = self._plans.get(key)
        if plan is None:
            pairs = []
            for ts in stamps:
                pair = around.get(ts)
                if pair is None:
                    tail = b"\x10" + encode_varint(ts)
                    head = b"\x12" + encode_varint(9 + len(tail)) + b"\x09"
                    pair = around[ts] = (head, tail)
                pairs.append(pair)
            if len(self._plans) >= 256:
                self._plans.clear()
            plan = self._plans[key] = _Plan(pairs)
        return plan


class _Plan:
    """The samples of one timestamp list: the bytes around each double, and how to write a group of
    series' values into them."""

    __slots__ = ("_pairs", "head", "record", "size", "struct", "template")

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self.template = b"".join(head + bytes(8) + tail for head, tail in pairs)  # one series' samples
        self.size = len(self.template)
        lengths = {(len(head), len(tail)) for head, tail in pairs}
        if len(lengths) == 1:  # every sample the same size: the doubles lie at a fixed stride
            head_len, tail_len = lengths.pop()
            self.head, self.record = head_len, head_len + 8 + tail_len
            self.struct = None
        else:  # timestamps whose varints differ in length: one struct call per series
            self.head = self.record = 0
            self.struct = struct.Struct("<" + "".join(f"{len(h)}sd{len(t)}s" for h, t in pairs))
            self.template = b""
            self._pairs = pairs

    def bodies(self, values: list[list[float]]) -> list[bytes | memoryview]:
        """Each series' samples, for the values of a group of series (``len`` of each: the stamps')."""
        if self.struct is not None:
            return [self._packed(v) for v in values]
        k = len(values)
        flat = list(itertools.chain.from_iterable(values))
        if len(flat) != k * self.size // self.record:
            raise ValueError("a series' values and timestamps differ in number")
        raw = struct.pack(f"<{len(flat)}d", *flat)
        buf = bytearray(self.template * k)
        start, record = self.head, self.record
        for b in range(8):
            buf[start + b :: record] = raw[b::8]
        view = memoryview(buf)
        size = self.size
        return [view[i : i + size] for i in range(0, k * size, size)]

    def _packed(self, values: list[float]) -> bytes:
        args: list[object] = []
        for (head, tail), v in zip(self._pairs, values, strict=True):
            args += (head, v, tail)
        assert self.struct is not None
        return self.struct.pack(*args)


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
