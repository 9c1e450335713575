"""The payload codec's decode, columnar: what the bridge reads instead of per-sample objects.

``gpu_exporter.forward.batch.decode`` builds a ``Sample`` with a dict of values per device per sample,
which is what the exporter side needs. The bridge needs the opposite shape, one column per series, and
the payload already is one. Reading the columns directly skips building and then taking apart ~90
dict entries per GPU-sample, which is most of the bridge's CPU time.

The same codec decides what is valid: this module calls the codec's own field validators and, for every
column that is not a plain integer-delta column, the codec's own column decoder. tests/
test_bridge_columns.py checks with hypothesis that ``read`` accepts exactly what ``batch.decode``
accepts and yields the same values.
"""

from __future__ import annotations

import itertools
import json
import operator
from dataclasses import dataclass
from typing import Any

from gpu_exporter.forward import batch as codec
from gpu_exporter.model import DeviceId, SeriesKey

__all__ = ["ColumnBatch", "ColumnDevice", "read"]

_SAFE = codec._SAFE_INT


@dataclass(frozen=True, slots=True)
class ColumnDevice:
    device: DeviceId
    info: dict[str, str]
    up: list[int | None]  # per sample: 1, 0, or None when the device is absent from that sample
    columns: list[list[float | None] | None]  # per metric (``ColumnBatch.metrics``), per sample


@dataclass(frozen=True, slots=True)
class ColumnBatch:
    node: str
    boot: str
    seqs: list[int]
    times_ms: list[int]
    metrics: list[SeriesKey]
    devices: list[ColumnDevice]


def read(data: bytes, max_bytes: int = codec.DEFAULT_MAX_BYTES) -> ColumnBatch:
    """The batch in ``data``, as columns. Raises codec.PayloadError, and only that, when invalid."""
    try:
        return _read(data, max_bytes)
    except codec.PayloadError:
        raise
    except Exception as exc:  # same promise as the codec: nothing else escapes
        raise codec.PayloadError(f"invalid payload: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None


def _read(data: bytes, max_bytes: int) -> ColumnBatch:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise codec.PayloadError(f"payload must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise codec.PayloadError(f"payload of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    if data[:2] == codec._GZIP_MAGIC:
        text = codec._gunzip(data, max_bytes)
    elif data.lstrip(b" \t\r\n")[:1] == b"{":
        text = data
    elif not data:
        raise codec.PayloadError("empty payload")
    else:
        raise codec.PayloadError(f"not a batch payload: starts with {data[:8]!r}")
    try:
        doc = json.loads(text.decode("utf-8"), parse_constant=codec._reject_constant)
    except UnicodeDecodeError as exc:
        raise codec.PayloadError(f"payload is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise codec.PayloadError(f"payload is not JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise codec.PayloadError("payload JSON is nested too deeply") from None
    return from_document(doc)


def from_document(doc: Any) -> ColumnBatch:
    """The checks of ``batch.from_document``, in the same order, keeping the columns."""
    c = codec
    if not isinstance(doc, dict):
        raise c.PayloadError("payload must be a JSON object")
    if doc.get("format") != c.FORMAT:
        raise c.PayloadError(f"payload format is {doc.get('format')!r}, expected {c.FORMAT!r}")
    version = doc.get("version")
    if version != c.VERSION or isinstance(version, bool):
        raise c.PayloadError(f"unsupported payload version {version!r}")
    c._keys("payload", doc, c._TOP_KEYS, c._TOP_KEYS)
    node = c._text("node", doc["node"])
    boot = c._text("boot", doc["boot"])
    seqs = c._undelta("seq", doc["seq"])
    n = len(seqs)
    if n == 0:
        raise c.PayloadError("seq: a batch needs at least one sample")
    if seqs[0] < 1 or any(b <= a for a, b in itertools.pairwise(seqs)):
        raise c.PayloadError("seq: sequence numbers must start at 1 or above and increase")
    if c._int("first_seq", doc["first_seq"]) != seqs[0] or c._int("last_seq", doc["last_seq"]) != seqs[-1]:
        raise c.PayloadError("first_seq/last_seq disagree with seq")
    times = c._undelta("time_ms", doc["time_ms"])
    if len(times) != n:
        raise c.PayloadError(f"time_ms has {len(times)} entries for {n} samples")
    metrics = c._metrics(doc["metrics"])
    raw_devices = doc["devices"]
    if not isinstance(raw_devices, list):
        raise c.PayloadError("devices must be an array")
    devices: list[ColumnDevice] = []
    seen: set[DeviceId] = set()
    for d, raw in enumerate(raw_devices):
        where = f"devices[{d}]"
        if not isinstance(raw, dict):
            raise c.PayloadError(f"{where} must be an object")
        c._keys(where, raw, c._DEVICE_KEYS, {"id", "up", "columns"})
        device = c._device_id(where, raw["id"])
        if device in seen:
            raise c.PayloadError(f"{where}: device {device.uuid} is listed twice")
        seen.add(device)
        info = c._info(where, raw.get("info", {}))
        up = raw["up"]
        if not isinstance(up, list) or len(up) != n:
            raise c.PayloadError(f"{where}.up must be an array of {n} entries")
        for v in up:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v not in (0, 1)):
                raise c.PayloadError(f"{where}.up entries must be 1, 0 or null, got {v!r}")
        cols = raw["columns"]
        if not isinstance(cols, list) or len(cols) != len(metrics):
            raise c.PayloadError(f"{where}.columns must be an array of {len(metrics)} entries")
        decoded = [None if col is None else _column(f"{where}.columns[{j}]", col, n) for j, col in enumerate(cols)]
        if None in up:
            for i, flag in enumerate(up):
                if flag is None and any(col is not None and col[i] is not None for col in decoded):
                    raise c.PayloadError(f"{where} has values in sample {seqs[i]} where it is absent (up null)")
        devices.append(ColumnDevice(device, dict(info), up, decoded))
    return ColumnBatch(node, boot, seqs, times, metrics, devices)


_int_types = {int}


def _column(where: str, value: Any, n: int) -> list[float | None]:
    """A plain delta column (integers, no nulls) decoded in C loops; anything else by the codec."""
    if type(value) is dict and "values" not in value:
        deltas = value.get("delta")
        scale = value.get("scale", 0)
        if (
            type(deltas) is list
            and len(deltas) == n
            and type(scale) is int
            and 0 <= scale <= codec.MAX_SCALE
            and len(value) == (2 if "scale" in value else 1)
            and set(map(type, deltas)) <= _int_types
            and n
        ):
            totals = list(itertools.accumulate(deltas))
            if max(map(abs, deltas)) < _SAFE and max(map(abs, totals)) < _SAFE:
                return list(map(operator.truediv, totals, itertools.repeat(10**scale)))
    return codec._column(where, value, n)
