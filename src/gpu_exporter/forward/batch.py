"""The batch payload (version 3, reading versions 1 and 2 too): the bytes a batch of samples travels as, and back.

One module holds both directions so that they cannot drift apart. The document is JSON, sent compressed
with zlib and a preset dictionary (``_zdict``: the JSON skeleton and catalog keys, so that even the
first occurrence of a key costs a back-reference), or plain, for debugging; version 1 agents sent gzip.
A reader tells them apart by the first bytes (``78``, ``1f 8b`` or ``{``). The document is columnar:
each device's labels, and each metric's key, appear once per batch, and the values of a series over the
batch's samples form one column. Columns of decimal numbers (integer percent, milliwatts, MHz, bytes...)
are stored as scaled integer deltas (or deltas of deltas, where shorter), a column that holds still as
its one value, and a column that moves in step with an earlier one of the same device (memory free
against memory used) as a reference to it. The full description is docs/payload.md; the JSON Schema is
``payload.schema.json`` next to this file.

``decode`` trusts nothing: anything malformed raises :class:`PayloadError` (one line a log can carry),
never another exception, and the size of the input and of the inflated document is bounded.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpu_exporter.forward._zdict import ZDICT, ZDICT_SUMMARY, ZDICT_V2
from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT",
    "VERSION",
    "VERSIONS",
    "Batch",
    "Header",
    "PayloadError",
    "Point",
    "decode",
    "encode",
    "peek",
    "schema",
    "verify",
]

FORMAT = "gpu-exporter.batch"
VERSION = 3  # what encode writes; decode reads this and every earlier version in VERSIONS
VERSIONS = (1, 2, 3)
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # compressed input and inflated JSON, each
MAX_SCALE = 9  # decimal places a delta column may carry
_SAFE_INT = 2**53  # beyond this JSON numbers stop being exact in most readers
_GZIP_MAGIC = b"\x1f\x8b"
_ZDICTS = {
    zlib.adler32(d).to_bytes(4, "big"): d for d in (ZDICT, ZDICT_SUMMARY, ZDICT_V2)
}  # by the id a zlib header names
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_SUMMARY_KEY = re.compile(r"^[a-z][a-z0-9_]*:(min|max|mean|last)$")  # in a summary batch (summary_ms set)
_MAX_WINDOW_MS = 366 * 86400 * 1000
_PART = re.compile(r"^[0-9a-f]{16}$")  # a part's name (forward/split.py): 8 bytes of a hash, in hex
_MAX_TEXT = 1024  # longest label value, node name, boot id, info value we accept
_ID_FIELDS = ("gpu", "uuid", "gpu_instance", "compute_instance", "mig_profile", "parent_uuid")
_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}


class PayloadError(ValueError):
    """A payload that is not a valid batch; the message is one line."""


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive samples of one agent boot, as forwarded together.

    Sequence numbers increase strictly but may have gaps (samples the ring overwrote before they were
    forwarded). Decoded samples carry ``up``, ``values`` and ``info`` of each device; ``processes`` and
    ``duration`` do not travel, and timestamps are whole milliseconds.
    """

    node: str
    boot: str
    samples: tuple[Sample, ...]
    summary_ms: int = 0  # a summary batch (forward/summary.py): its window in ms; 0 for full resolution
    part: str = ""  # some devices (or series) of its samples only (forward/split.py): its name; "" for all

    @property
    def first_seq(self) -> int:
        return self.samples[0].seq

    @property
    def last_seq(self) -> int:
        return self.samples[-1].seq

    def points(self) -> Iterator[Point]:
        """Every value of the batch, sample by sample (what a remote-write sender needs)."""
        for sample in self.samples:
            ts_ms = round(sample.timestamp * 1000)
            for dev in sample.devices:
                for (key, labels), value in dev.values.items():
                    yield Point(dev.device, key, labels, ts_ms, value, sample.seq)

    def device_states(self) -> Iterator[tuple[DeviceId, int, bool, int]]:
        """(device, timestamp in ms, up, seq) for every device in every sample."""
        for sample in self.samples:
            ts_ms = round(sample.timestamp * 1000)
            for dev in sample.devices:
                yield dev.device, ts_ms, dev.up, sample.seq


class Header(NamedTuple):
    """What ``peek`` reads: who sent the batch and which samples it holds."""

    node: str
    boot: str
    seqs: tuple[int, ...]
    times_ms: tuple[int, ...]
    version: int = VERSION
    summary_ms: int = 0
    part: str = ""

    @property
    def first_seq(self) -> int:
        return self.seqs[0]

    @property
    def last_seq(self) -> int:
        return self.seqs[-1]


class Point(NamedTuple):
    """One value: ``device.labels()`` gives the identity labels, ``key`` the catalog entry
    (``gpu_exporter.catalog.by_key``), ``labels`` the values of that entry's dynamic labels in order."""

    device: DeviceId
    key: str
    labels: tuple[str, ...]
    timestamp_ms: int
    value: float
    seq: int


# ---------------------------------------------------------------------------------------------- encode


def encode(batch: Batch, compress: bool = True, level: int = 9) -> bytes:
    """The payload of ``batch``: JSON compressed with zlib and the payload's preset dictionary, or
    plain JSON with ``compress=False``.

    Raises ValueError when the batch itself is unfit (no samples, sequence not increasing, bad names).
    """
    doc = to_document(batch)
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    if not compress:
        return text
    zdict = ZDICT_SUMMARY if batch.summary_ms else ZDICT
    deflater = zlib.compressobj(level, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, zdict)
    return deflater.compress(text) + deflater.flush()


def to_document(batch: Batch) -> dict[str, Any]:
    """The JSON document of ``batch`` (before serialisation), for tests and tools."""
    samples = batch.samples
    if not samples:
        raise ValueError("a batch needs at least one sample")
    _check_text("node", batch.node)
    _check_text("boot", batch.boot)
    for prev, cur in itertools.pairwise(samples):
        if cur.seq <= prev.seq:
            raise ValueError(f"sequence must increase within a batch: {cur.seq} after {prev.seq}")
    if samples[0].seq < 1:
        raise ValueError(f"sequence numbers start at 1, got {samples[0].seq}")

    if batch.summary_ms and not 0 < batch.summary_ms <= _MAX_WINDOW_MS:
        raise ValueError(f"summary window of {batch.summary_ms} ms is out of range")
    if batch.part and not _PART.match(batch.part):
        raise ValueError(f"part name {batch.part!r} is not 16 lowercase hex digits")
    key_re = _SUMMARY_KEY if batch.summary_ms else _KEY
    n = len(samples)
    metric_index: dict[SeriesKey, int] = {}
    devices: dict[DeviceId, dict[str, Any]] = {}
    columns: dict[DeviceId, dict[int, list[float | None]]] = {}
    for i, sample in enumerate(samples):
        for dev in sample.devices:
            entry = devices.get(dev.device)
            if entry is None:
                entry = {"id": _device_fields(dev.device), "up": [None] * n}
                devices[dev.device] = entry
                columns[dev.device] = {}
            elif entry["up"][i] is not None:
                raise ValueError(f"device {dev.device.uuid} appears twice in sample {sample.seq}")
            entry["up"][i] = 1 if dev.up else 0
            if dev.info:
                entry["info"] = dev.info  # the newest identity strings win
            cols = columns[dev.device]
            for series, value in dev.values.items():
                idx = metric_index.get(series)
                if idx is None:
                    key, labels = series
                    if not isinstance(key, str) or not key_re.match(key):
                        raise ValueError(f"invalid metric key {key!r}")
                    for label in labels:
                        _check_text("label value", label)
                    idx = metric_index[series] = len(metric_index)
                col = cols.get(idx)
                if col is None:
                    col = cols[idx] = [None] * n
                col[i] = float(value)

    out_devices = []
    for device_id, entry in devices.items():
        cols = columns[device_id]
        entry["columns"] = _encode_columns([cols.get(j) for j in range(len(metric_index))])
        if "info" in entry:
            entry["info"] = {str(k): str(v) for k, v in entry["info"].items()}
            for k, v in entry["info"].items():
                _check_text("info key", k)
                _check_text("info value", v, allow_empty=True)
        out_devices.append(entry)

    doc: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "node": batch.node,
        "boot": batch.boot,
        "first_seq": samples[0].seq,
        "last_seq": samples[-1].seq,
        "seq": _deltas([s.seq for s in samples]),
        "time_ms": _deltas([round(s.timestamp * 1000) for s in samples]),
        "metrics": [[key, list(labels)] for key, labels in metric_index],
        "devices": out_devices,
    }
    if batch.summary_ms:
        doc["summary_ms"] = batch.summary_ms
    if batch.part:
        doc["part"] = batch.part
    return doc


def _check_text(what: str, value: object, allow_empty: bool = False) -> None:
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > _MAX_TEXT:
        raise ValueError(f"invalid {what} {value!r}")


def _device_fields(device: DeviceId) -> dict[str, str]:
    fields = {name: getattr(device, name) for name in _ID_FIELDS}
    for name, value in fields.items():
        _check_text(f"device {name}", value, allow_empty=name not in ("gpu", "uuid"))
    return {k: v for k, v in fields.items() if v or k in ("gpu", "uuid")}


def _deltas(values: Sequence[int]) -> list[int]:
    return [values[0]] + [b - a for a, b in itertools.pairwise(values)]


def _scale_of(value: float) -> int | None:
    """Fewest decimal places that hold ``value`` exactly (as decode computes it), or None."""
    if value.is_integer():
        if abs(value) < _SAFE_INT and (value != 0 or math.copysign(1.0, value) > 0):
            return 0
        return None
    if not math.isfinite(value):
        return None
    for k in range(1, MAX_SCALE + 1):
        p = 10**k
        scaled = value * p
        if abs(scaled) >= _SAFE_INT:
            return None
        if round(scaled) / p == value:
            return k
    return None


def _encode_columns(cols: list[list[float | None] | None]) -> list[Any]:
    """One device's columns in the version 3 forms: null, a constant, a delta array, plain values, or a
    reference to an earlier column that this one moves in step with (same or opposite changes)."""
    out: list[Any] = []
    by_steps: dict[tuple[float, ...], int] = {}  # changes between samples -> an earlier gapless column
    for j, col in enumerate(cols):
        if col is None:
            out.append(None)
            continue
        encoded = _encode_column(col)
        if isinstance(encoded, list) and None not in col:
            values: list[float] = col  # type: ignore[assignment]
            steps = tuple(b - a for a, b in itertools.pairwise(values))
            ref = _reference(values, steps, by_steps, cols)
            if ref is not None and len(_json(ref)) < len(_json(encoded)):
                encoded = ref
            by_steps.setdefault(steps, j)
        out.append(encoded)
    return out


def _reference(
    values: list[float],
    steps: tuple[float, ...],
    by_steps: dict[tuple[float, ...], int],
    cols: list[list[float | None] | None],
) -> dict[str, Any] | None:
    """``{"ref": j, "sign": s, "add": c}`` when ``c + s * column j`` gives back ``values`` bit for bit."""
    for sign in (1, -1):
        j = by_steps.get(steps if sign == 1 else tuple(-x for x in steps))
        if j is None:
            continue
        other: list[float] = cols[j]  # type: ignore[assignment]
        add = values[0] - sign * other[0]
        if not math.isfinite(add) or not all(
            _same_float(add + sign * o, v) for o, v in zip(other, values, strict=True)
        ):
            continue
        ref: dict[str, Any] = {"ref": j}
        if sign < 0:
            ref["sign"] = -1
        if add:
            ref["add"] = int(add) if add.is_integer() and abs(add) < _SAFE_INT else add
        return ref
    return None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _encode_column(col: list[float | None]) -> Any:
    """A constant (a number, or "NaN", "+Inf", "-Inf"), a delta array ``[form, (step), d...]``, or
    ``{"values": [...]}``; docs/payload.md has the forms."""
    first = col[0]
    if first is not None and all(v is not None and _same_float(v, first) for v in col):
        if first.is_integer() and abs(first) < _SAFE_INT and math.copysign(1.0, first) > 0:
            return int(first)  # a value that held still for the whole batch, stated once
        return _raw(first)
    scale = 0
    for v in col:
        if v is None:
            continue
        k = _scale_of(v)
        if k is None:
            return {"values": [_raw(v) for v in col]}
        scale = max(scale, k)
    p = 10**scale
    ints: list[int | None] = []
    step = 0
    for v in col:
        if v is None:
            ints.append(None)
            continue
        n = round(v * p)
        if abs(n) >= _SAFE_INT or n / p != v:  # pragma: no cover - _scale_of already proved this
            return {"values": [_raw(v) for v in col]}
        ints.append(n)
        step = math.gcd(step, n)
    step = step or 1  # all zero
    out: list[int | None] = []
    last = 0
    for n in ints:
        if n is None:
            out.append(None)
            continue
        out.append(n // step - last)
        last = n // step
    if not _in_range(out):  # a swing across nearly all of ±2**53: the deltas would not be exact in JSON
        return {"values": [_raw(v) for v in col]}
    order = 1
    if None not in out and len(out) > 2:
        # A counter at a steady rate (energy, NVLink bytes) or a smooth reading: its deltas change
        # less than the values do. Take the deltas of the deltas where they are written shorter.
        second = [out[0], *_deltas(out[1:])]  # type: ignore[arg-type]
        if _digits(second) < _digits(out) and _in_range(second):
            out, order = second, 2
    form = scale + 10 * (order - 1)
    if step > 1:  # a common factor: 1024 for KiB-based rates, 10**6 for MHz clocks
        return [form + _HAS_STEP, step, *out]
    return [form, *out]


_HAS_STEP = 20  # added to a delta array's form when a step follows it


def _in_range(ints: list[int | None]) -> bool:
    return all(n is None or abs(n) < _SAFE_INT for n in ints)


def _digits(ints: list[Any]) -> int:
    return sum(len(str(n)) for n in ints)


def _same_float(a: float, b: float) -> bool:
    """Bit for bit: -0.0 is not 0.0, NaN is NaN."""
    if a != a or b != b:  # NaN
        return a != a and b != b
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _raw(v: float | None) -> float | str | None:
    if v is None or math.isfinite(v):
        return v
    if math.isnan(v):
        return "NaN"
    return "+Inf" if v > 0 else "-Inf"


# ---------------------------------------------------------------------------------------------- decode


def decode(data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> Batch:
    """The batch in ``data`` (zlib, gzip or plain JSON). Raises PayloadError, and only that, when invalid."""
    try:
        return _decode(data, max_bytes)
    except PayloadError:
        raise
    except Exception as exc:  # defensive: a malformed payload must never escape as anything else
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {_one_line(str(exc))}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def _decode(data: bytes | bytearray | memoryview, max_bytes: int) -> Batch:
    return from_document(_parse(data, max_bytes))


def _parse(data: bytes | bytearray | memoryview, max_bytes: int) -> Any:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PayloadError(f"payload must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise PayloadError(f"payload of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    if data[:2] == _GZIP_MAGIC:
        text = _gunzip(data, max_bytes)
    elif _is_zlib(data):
        text = _inflate(data, max_bytes)
    elif data.lstrip(b" \t\r\n")[:1] == b"{":
        text = data
    elif not data:
        raise PayloadError("empty payload")
    else:
        raise PayloadError(f"not a batch payload: starts with {data[:8]!r} (expected zlib, gzip or '{{')")
    try:
        return json.loads(text.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise PayloadError(f"payload is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"payload is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise PayloadError("payload JSON is nested too deeply") from None


_PREAMBLES = {v: f'{{"format":"{FORMAT}","version":{v},'.encode() for v in VERSIONS}


def verify(data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Integrity check of a payload this encoder wrote (a spooled batch): the zlib (or gzip) stream
    inflates in full with a matching checksum and length, and starts with a known preamble. Inflates in
    small chunks and keeps nothing, so it costs next to no memory. Plain JSON gets the ``peek`` check
    instead. Raises PayloadError, and only that."""
    try:
        raw = bytes(data)
        if raw[:2] == _GZIP_MAGIC:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        elif _is_zlib(raw):
            inflater = _zlib_inflater(raw)
        else:
            peek(raw, max_bytes)
            return
        size = len(_PREAMBLES[VERSION])
        head = inflater.decompress(raw, size)
        if head not in _PREAMBLES.values():
            raise PayloadError("not a batch written by this encoder")
        total = len(head)
        while not inflater.eof:
            chunk = inflater.decompress(inflater.unconsumed_tail, 65536)
            total += len(chunk)
            if total > max_bytes:
                raise PayloadError(f"payload inflates beyond the {max_bytes}-byte limit")
            if not chunk and not inflater.unconsumed_tail:
                raise PayloadError(f"truncated {'gzip' if raw[:2] == _GZIP_MAGIC else 'zlib'} payload")
        if inflater.unused_data:
            raise PayloadError("trailing bytes after the compressed payload")
    except PayloadError:
        raise
    except zlib.error as exc:
        raise PayloadError(f"corrupt compressed payload: {exc}") from None
    except Exception as exc:  # defensive, as in decode
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {_one_line(str(exc))}") from None


def peek(data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> Header:
    """Check framing, JSON and the batch header without building samples (a fraction of ``decode``'s
    cost): what the forwarder runs on a spooled batch before publishing it, and what a receiver can use
    to drop a repeat by (node, boot, seq) before decoding. Raises PayloadError, and only that."""
    try:
        doc = _parse(data, max_bytes)
        return _header(doc)
    except PayloadError:
        raise
    except Exception as exc:  # defensive, as in decode
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {_one_line(str(exc))}") from None


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    return _finish(zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), data, max_bytes, "gzip")


def _is_zlib(data: bytes) -> bool:
    """A zlib stream (RFC 1950) with a preset dictionary: deflate, a valid header check, FDICT set."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and data[0] >> 4 <= 7 and (data[0] << 8 | data[1]) % 31 == 0


def _zlib_inflater(data: bytes) -> Any:
    if not data[1] & 0x20:
        raise PayloadError("zlib payload without the preset dictionary")
    if len(data) < 6:
        raise PayloadError("truncated zlib payload")
    zdict = _ZDICTS.get(data[2:6])
    if zdict is None:
        raise PayloadError(f"zlib payload with an unknown preset dictionary (id {data[2:6].hex()})")
    return zlib.decompressobj(wbits=zlib.MAX_WBITS, zdict=zdict)


def _inflate(data: bytes, max_bytes: int) -> bytes:
    return _finish(_zlib_inflater(data), data, max_bytes, "zlib")


def _finish(inflater: Any, data: bytes, max_bytes: int, kind: str) -> bytes:
    try:
        text: bytes = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise PayloadError(f"corrupt {kind} payload: {exc}") from None
    if len(text) > max_bytes:
        raise PayloadError(f"payload inflates beyond the {max_bytes}-byte limit")
    if not inflater.eof:
        raise PayloadError(f"truncated {kind} payload")
    if inflater.unused_data:
        raise PayloadError(f"trailing bytes after the {kind} payload")
    return text


def _reject_constant(name: str) -> Any:
    raise PayloadError(f'payload uses the non-JSON number {name} (write "NaN", "+Inf" or "-Inf")')


_REQUIRED_TOP_KEYS = frozenset(
    ("format", "version", "node", "boot", "first_seq", "last_seq", "seq", "time_ms", "metrics", "devices")
)
_TOP_KEYS = _REQUIRED_TOP_KEYS | {"summary_ms", "part"}
_DEVICE_KEYS = frozenset(("id", "info", "up", "columns"))


def from_document(doc: Any) -> Batch:
    """Validate a parsed JSON document and build the batch (PayloadError when invalid)."""
    header = _header(doc)
    node, boot, seqs, times = header.node, header.boot, header.seqs, header.times_ms
    n = len(seqs)

    metrics = _metrics(doc["metrics"], bool(header.summary_ms))
    raw_devices = doc["devices"]
    if not isinstance(raw_devices, list):
        raise PayloadError(f"devices must be an array, not {_jtype(raw_devices)}")

    per_sample: list[list[DeviceSample]] = [[] for _ in range(n)]
    seen: set[DeviceId] = set()
    for d, raw in enumerate(raw_devices):
        where = f"devices[{d}]"
        if not isinstance(raw, dict):
            raise PayloadError(f"{where} must be an object, not {_jtype(raw)}")
        _keys(where, raw, _DEVICE_KEYS, {"id", "up", "columns"})
        device = _device_id(where, raw["id"])
        if device in seen:
            raise PayloadError(f"{where}: device {device.uuid} is listed twice")
        seen.add(device)
        info = _info(where, raw.get("info", {}))
        up = raw["up"]
        if not isinstance(up, list) or len(up) != n:
            raise PayloadError(f"{where}.up must be an array of {n} entries")
        for v in up:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v not in (0, 1)):
                raise PayloadError(f"{where}.up entries must be 1, 0 or null, got {v!r}")
        cols = raw["columns"]
        if not isinstance(cols, list) or len(cols) != len(metrics):
            raise PayloadError(f"{where}.columns must be an array of {len(metrics)} entries (one per metric)")
        decoded = _columns(where, cols, n, header.version)
        for i in range(n):
            values: dict[SeriesKey, float] = {}
            for j, col in enumerate(decoded):
                if col is not None and col[i] is not None:
                    values[metrics[j]] = col[i]  # type: ignore[assignment]
            if up[i] is None:
                if values:
                    raise PayloadError(f"{where} has values in sample {seqs[i]} where it is absent (up null)")
                continue
            per_sample[i].append(DeviceSample(device, bool(up[i]), values, dict(info)))

    samples = tuple(Sample(seq=seqs[i], timestamp=times[i] / 1000, devices=tuple(per_sample[i])) for i in range(n))
    return Batch(node=node, boot=boot, samples=samples, summary_ms=header.summary_ms, part=header.part)


def _header(doc: Any) -> Header:
    if not isinstance(doc, dict):
        raise PayloadError(f"payload must be a JSON object, not {_jtype(doc)}")
    if doc.get("format") != FORMAT:
        raise PayloadError(f"payload format is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if version not in VERSIONS or isinstance(version, bool) or not isinstance(version, int):
        raise PayloadError(f"unsupported payload version {version!r} (this reader knows 1, 2 and 3)")
    _keys("payload", doc, _TOP_KEYS if version >= 3 else _REQUIRED_TOP_KEYS, _REQUIRED_TOP_KEYS)
    summary_ms = _int("summary_ms", doc["summary_ms"]) if "summary_ms" in doc else 0
    if "summary_ms" in doc and not 0 < summary_ms <= _MAX_WINDOW_MS:
        raise PayloadError(f"summary_ms must be 1 to {_MAX_WINDOW_MS}, got {summary_ms}")
    part = doc.get("part", "")
    if "part" in doc and (not isinstance(part, str) or not _PART.match(part)):
        got = repr(part[:40]) if isinstance(part, str) else _jtype(part)
        raise PayloadError(f"part must be a name of 16 lowercase hex digits, got {got}")
    node = _text("node", doc["node"])
    boot = _text("boot", doc["boot"])
    seqs = _undelta("seq", doc["seq"])
    n = len(seqs)
    if n == 0:
        raise PayloadError("seq: a batch needs at least one sample")
    if seqs[0] < 1 or any(b <= a for a, b in itertools.pairwise(seqs)):
        raise PayloadError("seq: sequence numbers must start at 1 or above and increase")
    if _int("first_seq", doc["first_seq"]) != seqs[0] or _int("last_seq", doc["last_seq"]) != seqs[-1]:
        raise PayloadError(
            f"first_seq/last_seq {doc['first_seq']}/{doc['last_seq']} disagree with seq {seqs[0]}..{seqs[-1]}"
        )
    times = _undelta("time_ms", doc["time_ms"])
    if len(times) != n:
        raise PayloadError(f"time_ms has {len(times)} entries for {n} samples")
    for field in ("metrics", "devices"):
        if not isinstance(doc[field], list):
            raise PayloadError(f"{field} must be an array, not {_jtype(doc[field])}")
    return Header(node, boot, tuple(seqs), tuple(times), version, summary_ms, part)


def _jtype(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _keys(where: str, obj: dict[str, Any], allowed: frozenset[str], required: set[str] | frozenset[str]) -> None:
    missing = sorted(required - obj.keys())
    if missing:
        raise PayloadError(f"{where} lacks {', '.join(missing)}")
    extra = sorted(str(k) for k in obj.keys() - allowed)
    if extra:
        raise PayloadError(f"{where} has unknown field {extra[0]!r}")


def _text(where: str, value: Any, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise PayloadError(f"{where} must be a string, not {_jtype(value)}")
    if (not value and not allow_empty) or len(value) > _MAX_TEXT:
        raise PayloadError(f"{where} must be 1 to {_MAX_TEXT} characters")
    return value


def _int(where: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PayloadError(f"{where} must be an integer, not {_jtype(value)}")
    if abs(value) >= _SAFE_INT:
        raise PayloadError(f"{where} is out of range")
    return value


def _undelta(where: str, value: Any) -> list[int]:
    if not isinstance(value, list):
        raise PayloadError(f"{where} must be an array, not {_jtype(value)}")
    out: list[int] = []
    total = 0
    for v in value:
        total += _int(where, v)
        if abs(total) >= _SAFE_INT:
            raise PayloadError(f"{where} runs out of range")
        out.append(total)
    return out


def _metrics(value: Any, summary: bool = False) -> list[SeriesKey]:
    if not isinstance(value, list):
        raise PayloadError(f"metrics must be an array, not {_jtype(value)}")
    out: list[SeriesKey] = []
    for j, item in enumerate(value):
        where = f"metrics[{j}]"
        if not isinstance(item, list) or len(item) != 2:
            raise PayloadError(f"{where} must be [key, [label values]]")
        key, labels = item
        if not isinstance(key, str) or not (_SUMMARY_KEY if summary else _KEY).match(key) or len(key) > 128:
            raise PayloadError(f"{where}: invalid metric key {key!r}")
        if not isinstance(labels, list):
            raise PayloadError(f"{where}: label values must be an array")
        out.append((key, tuple(_text(f"{where} label value", v) for v in labels)))
    if len(set(out)) != len(out):
        raise PayloadError("metrics lists a series twice")
    return out


def _device_id(where: str, value: Any) -> DeviceId:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}.id must be an object, not {_jtype(value)}")
    _keys(f"{where}.id", value, frozenset(_ID_FIELDS), {"gpu", "uuid"})
    fields = {
        name: _text(f"{where}.id.{name}", value[name], allow_empty=name not in ("gpu", "uuid"))
        for name in _ID_FIELDS
        if name in value
    }
    return DeviceId(**fields)


def _info(where: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}.info must be an object, not {_jtype(value)}")
    for k, v in value.items():
        _text(f"{where}.info key", k)
        _text(f"{where}.info[{k!r}]", v, allow_empty=True)
    return value


def _columns(where: str, cols: list[Any], n: int, version: int) -> list[list[float | None] | None]:
    """A device's columns, decoded in order (a reference names an earlier one)."""
    out: list[list[float | None] | None] = []
    for j, col in enumerate(cols):
        out.append(None if col is None else _column(f"{where}.columns[{j}]", col, n, version, out))
    return out


def _column(
    where: str, value: Any, n: int, version: int = VERSION, earlier: Sequence[list[float | None] | None] = ()
) -> list[float | None]:
    """One column's values; ``earlier`` holds the device's columns before it (for a reference)."""
    if version >= 3 and not isinstance(value, dict):
        if isinstance(value, list):
            return _delta_array(where, value, n)
        const = _raw_value(where, value)
        if const is None:
            raise PayloadError(f"{where} must be a number, an array or an object")
        return [const] * n
    if not isinstance(value, dict):
        raise PayloadError(f"{where} must be an object or null, not {_jtype(value)}")
    if "values" in value:
        _keys(where, value, frozenset(("values",)), {"values"})
        raw = value["values"]
        if not isinstance(raw, list) or len(raw) != n:
            raise PayloadError(f"{where}.values must be an array of {n} entries")
        return [_raw_value(where, v) for v in raw]
    if version >= 3:
        if "ref" not in value:
            raise PayloadError(
                f"{where}: an object column holds values or ref, not {', '.join(sorted(map(str, value)))}"
            )
        return _reference_column(where, value, earlier)
    if "const" in value and version >= 2:
        _keys(where, value, frozenset(("const",)), {"const"})
        const = _raw_value(where, value["const"])
        if const is None:
            raise PayloadError(f"{where}.const must be a value, not null")
        return [const] * n
    allowed = _DELTA_KEYS if version >= 2 else _DELTA_KEYS_V1
    _keys(where, value, allowed, {"delta"})
    scale = _int(f"{where}.scale", value.get("scale", 0))
    if not 0 <= scale <= MAX_SCALE:
        raise PayloadError(f"{where}.scale must be 0 to {MAX_SCALE}, got {scale}")
    step = _int(f"{where}.step", value.get("step", 1))
    if step < 1:
        raise PayloadError(f"{where}.step must be 1 or more, got {step}")
    order = _int(f"{where}.order", value.get("order", 1))
    if order not in (1, 2):
        raise PayloadError(f"{where}.order must be 1 or 2, got {order}")
    return _undelta_column(f"{where}.delta", value["delta"], n, scale, step, order)


def _delta_array(where: str, value: list[Any], n: int) -> list[float | None]:
    """``[form, (step), d_0 ... d_n-1]``: form = scale + 10 * (order - 1), plus 20 when a step follows."""
    form = _int(f"{where}[0]", value[0]) if value else -1
    if not 0 <= form < 2 * _HAS_STEP:
        raise PayloadError(f"{where}: a delta array starts with its form, 0 to {2 * _HAS_STEP - 1}")
    has_step = form >= _HAS_STEP
    if len(value) != n + 1 + has_step:
        raise PayloadError(f"{where} must hold the form, {'the step, ' if has_step else ''}and {n} deltas")
    step = _int(f"{where}[1]", value[1]) if has_step else 1
    if step < 1:
        raise PayloadError(f"{where}: step must be 1 or more, got {step}")
    form %= _HAS_STEP
    return _undelta_column(where, value[1 + has_step :], n, form % 10, step, 1 + form // 10)


def _undelta_column(where: str, deltas: Any, n: int, scale: int, step: int, order: int) -> list[float | None]:
    if not isinstance(deltas, list) or len(deltas) != n:
        raise PayloadError(f"{where} must be an array of {n} deltas")
    if order == 2:
        if None in deltas:
            raise PayloadError(f"{where}: deltas of order 2 cannot hold null")
        for v in deltas:
            _int(where, v)
        deltas = deltas[:1] + list(itertools.accumulate(deltas[1:]))
        if any(abs(v) >= 2 * _SAFE_INT for v in deltas):
            raise PayloadError(f"{where} runs out of range")
    p = 10**scale
    out: list[float | None] = []
    total = 0
    for v in deltas:
        if v is None:
            out.append(None)
            continue
        total += v if order == 2 else _int(where, v)
        if abs(total * step) >= _SAFE_INT:
            raise PayloadError(f"{where} runs out of range")
        out.append(total * step / p)
    return out


def _reference_column(
    where: str, value: dict[str, Any], earlier: Sequence[list[float | None] | None]
) -> list[float | None]:
    """``{"ref": j, "sign": s, "add": c}``: ``c + s * v`` for each value ``v`` of the earlier column j."""
    _keys(where, value, _REF_KEYS, {"ref"})
    j = _int(f"{where}.ref", value["ref"])
    other = earlier[j] if 0 <= j < len(earlier) else None
    if other is None:
        raise PayloadError(f"{where}.ref must name an earlier column of the device that is not null")
    sign = _int(f"{where}.sign", value.get("sign", 1))
    if sign not in (1, -1):
        raise PayloadError(f"{where}.sign must be 1 or -1, got {sign}")
    add = _raw_value(f"{where}.add", value.get("add", 0))
    if add is None or not math.isfinite(add):
        raise PayloadError(f"{where}.add must be a finite number")
    return [None if v is None else add + sign * v for v in other]


_REF_KEYS = frozenset(("ref", "sign", "add"))
_DELTA_KEYS_V1 = frozenset(("delta", "scale", "step"))
_DELTA_KEYS = frozenset(("delta", "scale", "step", "order"))


def _raw_value(where: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, str):
        if v in _SPECIAL:
            return _SPECIAL[v]
        raise PayloadError(f'{where}: invalid value {v[:20]!r} (numbers, null, "NaN", "+Inf", "-Inf")')
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise PayloadError(f"{where}: invalid value of type {_jtype(v)}")
    f = float(v)
    if not math.isfinite(f):
        raise PayloadError(f"{where}: number out of range")
    return f


def schema() -> dict[str, Any]:
    """The JSON Schema of the document, versions 1 to 3 (payload.schema.json, shipped with the package)."""
    from importlib import resources

    text = resources.files("gpu_exporter.forward").joinpath("payload.schema.json").read_text("utf-8")
    result: dict[str, Any] = json.loads(text)
    return result
