"""Encoding: a batch to its payload, JSON compressed with zlib and the preset dictionary, or plain
(docs/payload.md has the column forms)."""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import zlib
from collections.abc import Sequence
from typing import Any

from gpu_exporter.model import DeviceId, Readings, Sample, SeriesKey
from gpu_exporter.payload import types as fmt
from gpu_exporter.payload._zdict import ZDICT, ZDICT_HEALTH, ZDICT_SUMMARY
from gpu_exporter.payload.health import check_report, health_document
from gpu_exporter.payload.types import Batch

__all__ = ["encode", "to_document"]


def encode(batch: Batch, compress: bool = True, level: int = 9) -> bytes:
    """The payload of ``batch``: JSON compressed with zlib and the payload's preset dictionary, or
    plain JSON with ``compress=False``.

    Raises ValueError when the batch itself is unfit (no samples, sequence not increasing, bad names).
    """
    doc = to_document(batch)
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
    if not compress:
        return text
    zdict = ZDICT_HEALTH if batch.health else ZDICT_SUMMARY if batch.summary_ms else ZDICT
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

    if batch.summary_ms and not 0 < batch.summary_ms <= fmt.MAX_WINDOW_MS:
        raise ValueError(f"summary window of {batch.summary_ms} ms is out of range")
    if batch.part and not fmt.PART.match(batch.part):
        raise ValueError(f"part name {batch.part!r} is not 16 lowercase hex digits")
    if batch.health:
        check_report(batch)
    key_re = fmt.SUMMARY_KEY if batch.summary_ms else fmt.KEY
    n = len(samples)
    metric_index: dict[SeriesKey, int] = {}
    one = _one_sample if n == 1 else _samples  # one sample: the spool's journal, one a cycle
    out_devices = one(samples, metric_index, key_re)

    doc: dict[str, Any] = {
        "format": fmt.FORMAT,
        "version": fmt.VERSION,
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
    if batch.health:
        doc["health"] = health_document(batch)
    return doc


def _samples(samples: Sequence[Sample], metric_index: dict[SeriesKey, int], key_re: re.Pattern[str]) -> list[Any]:
    """The devices of a batch, their columns in the version 3 forms (``metric_index`` filled in)."""
    n = len(samples)
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
                    _check_series(series, key_re)
                    idx = metric_index[series] = len(metric_index)
                col = cols.get(idx)
                if col is None:
                    col = cols[idx] = [None] * n
                col[i] = float(value)
    out = []
    for device_id, entry in devices.items():
        cols = columns[device_id]
        entry["columns"] = _encode_columns([cols.get(j) for j in range(len(metric_index))])
        out.append(_checked_info(entry))
    return out


def _one_sample(samples: Sequence[Sample], metric_index: dict[SeriesKey, int], key_re: re.Pattern[str]) -> list[Any]:
    """``_samples`` for a batch of one sample (the spool's journal: one a cycle), faster: each column
    is a constant, its value, placed at once (the same document)."""
    safe = fmt.SAFE_INT
    copysign, isfinite = math.copysign, math.isfinite
    sample = samples[0]
    rows: list[tuple[dict[str, Any], list[int], list[Any]]] = []
    seen: set[DeviceId] = set()
    for dev in sample.devices:
        if dev.device in seen:
            raise ValueError(f"device {dev.device.uuid} appears twice in sample {sample.seq}")
        seen.add(dev.device)
        values = dev.values
        if isinstance(values, Readings):
            keys, numbers = values.keys_tuple, values.numbers()
        else:
            keys, numbers = tuple(values), tuple(float(v) for v in values.values())
        checked = values.memo.setdefault("payload_keys", set()) if isinstance(values, Readings) else set()
        if key_re not in checked:  # a key set is checked once (per key pattern), not every cycle
            for series in keys:
                _check_series(series, key_re)
            checked.add(key_re)
        where = []
        for series in keys:
            idx = metric_index.get(series)
            if idx is None:
                idx = metric_index[series] = len(metric_index)
            where.append(idx)
        # _constant, written out: an integer where it is one (not -0.0), else the value as written
        constants = [
            int(v)
            if v.is_integer() and 0.0 <= v < safe and (v or copysign(1.0, v) > 0)
            else v
            if isfinite(v)
            else json_value(v)
            for v in numbers
        ]
        entry: dict[str, Any] = {"id": _id_cached(dev.device), "up": [1 if dev.up else 0]}
        if dev.info:
            entry["info"] = dev.info
        rows.append((entry, where, constants))
    out = []
    for entry, where, constants in rows:
        cols: list[Any] = [None] * len(metric_index)
        for idx, constant in zip(where, constants, strict=True):
            cols[idx] = constant
        entry["columns"] = cols
        if "info" in entry:
            entry["info"] = _info_cached(entry["info"])
        out.append(entry)
    return out


@functools.lru_cache(maxsize=1024)
def _id_items(device: DeviceId) -> tuple[tuple[str, str], ...]:
    return tuple(_device_fields(device).items())


@functools.lru_cache(maxsize=1024)
def _info_items(items: tuple[tuple[Any, Any], ...]) -> tuple[tuple[str, str], ...]:
    return tuple(_info_fields(dict(items)).items())


def _id_cached(device: DeviceId) -> dict[str, str]:
    """``_device_fields``, checked once per device identity (a copy: the document's own)."""
    try:
        return dict(_id_items(device))
    except TypeError:  # a field that is not hashable: refused the long way
        return _device_fields(device)


def _info_cached(info: dict[str, Any]) -> dict[str, str]:
    """``_info_fields``, checked once per set of identity strings (a copy: the document's own)."""
    try:
        return dict(_info_items(tuple(info.items())))
    except TypeError:
        return _info_fields(info)


def _info_fields(info: dict[str, Any]) -> dict[str, str]:
    out = {str(k): str(v) for k, v in info.items()}
    for k, v in out.items():
        _check_text("info key", k)
        _check_text("info value", v, allow_empty=True)
    return out


def _check_series(series: SeriesKey, key_re: re.Pattern[str]) -> None:
    key, labels = series
    if not isinstance(key, str) or not key_re.match(key):
        raise ValueError(f"invalid metric key {key!r}")
    for label in labels:
        _check_text("label value", label)


def _checked_info(entry: dict[str, Any]) -> dict[str, Any]:
    if "info" in entry:
        entry["info"] = _info_fields(entry["info"])
    return entry


def _check_text(what: str, value: object, allow_empty: bool = False) -> None:
    if not isinstance(value, str) or (not value and not allow_empty) or len(value) > fmt.MAX_TEXT:
        raise ValueError(f"invalid {what} {value!r}")


def _device_fields(device: DeviceId) -> dict[str, str]:
    fields = {name: getattr(device, name) for name in fmt.ID_FIELDS}
    for name, value in fields.items():
        _check_text(f"device {name}", value, allow_empty=name not in ("gpu", "uuid"))
    return {k: v for k, v in fields.items() if v or k in ("gpu", "uuid")}


def _deltas(values: Sequence[int]) -> list[int]:
    return [values[0]] + [b - a for a, b in itertools.pairwise(values)]


def _scale_of(value: float) -> int | None:
    """Fewest decimal places that hold ``value`` exactly (as decode computes it), or None."""
    if value.is_integer():
        if abs(value) < fmt.SAFE_INT and (value != 0 or math.copysign(1.0, value) > 0):
            return 0
        return None
    if not math.isfinite(value):
        return None
    for k in range(1, fmt.MAX_SCALE + 1):
        p = 10**k
        scaled = value * p
        if abs(scaled) >= fmt.SAFE_INT:
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
            ref["add"] = int(add) if add.is_integer() and abs(add) < fmt.SAFE_INT else add
        return ref
    return None


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _encode_column(col: list[float | None]) -> Any:
    """A constant (a number, or "NaN", "+Inf", "-Inf"), a delta array ``[form, (step), d...]``, or
    ``{"values": [...]}``; docs/payload.md has the forms."""
    first = col[0]
    if first is not None and all(v is not None and _same_float(v, first) for v in col):
        return _constant(first)  # a value that held still for the whole batch, stated once
    scale = 0
    for v in col:
        if v is None:
            continue
        k = _scale_of(v)
        if k is None:
            return {"values": [json_value(v) for v in col]}
        scale = max(scale, k)
    p = 10**scale
    ints: list[int | None] = []
    step = 0
    for v in col:
        if v is None:
            ints.append(None)
            continue
        n = round(v * p)
        if abs(n) >= fmt.SAFE_INT or n / p != v:  # pragma: no cover - _scale_of already proved this
            return {"values": [json_value(v) for v in col]}
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
        return {"values": [json_value(v) for v in col]}
    order = 1
    if None not in out and len(out) > 2:
        # A counter at a steady rate (energy, NVLink bytes) or a smooth reading: its deltas change
        # less than the values do. Take the deltas of the deltas where they are written shorter.
        second = [out[0], *_deltas(out[1:])]  # type: ignore[arg-type]
        if _digits(second) < _digits(out) and _in_range(second):
            out, order = second, 2
    form = scale + 10 * (order - 1)
    if step > 1:  # a common factor: 1024 for KiB-based rates, 10**6 for MHz clocks
        return [form + fmt.HAS_STEP, step, *out]
    return [form, *out]


def _constant(value: float | None) -> Any:
    """A column whose every value is ``value``: an integer where it is one, else as the payload writes it."""
    if value is not None and value.is_integer() and abs(value) < fmt.SAFE_INT and math.copysign(1.0, value) > 0:
        return int(value)
    return json_value(value)


def _in_range(ints: list[int | None]) -> bool:
    return all(n is None or abs(n) < fmt.SAFE_INT for n in ints)


def _digits(ints: list[Any]) -> int:
    return sum(len(str(n)) for n in ints)


def _same_float(a: float, b: float) -> bool:
    """Bit for bit: -0.0 is not 0.0, NaN is NaN."""
    if a != a or b != b:  # NaN
        return a != a and b != b
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def json_value(v: float | None) -> float | str | None:
    """A value as the payload writes it: a number, null, or "NaN", "+Inf", "-Inf"."""
    if v is None or math.isfinite(v):
        return v
    if math.isnan(v):
        return "NaN"
    return "+Inf" if v > 0 else "-Inf"


# ---------------------------------------------------------------------------------------------- decode
