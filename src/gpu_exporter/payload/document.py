"""The document: the checks of a parsed payload's fields and the decoding of its columns, into a Batch
(``from_document``), and the JSON Schema it follows. The bridge's columnar reader (columns.py) calls the
same validators."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey
from gpu_exporter.payload.health import read_health
from gpu_exporter.payload.types import (
    FORMAT,
    HAS_STEP,
    ID_FIELDS,
    KEY,
    MAX_SCALE,
    MAX_TEXT,
    MAX_WINDOW_MS,
    PART,
    SAFE_INT,
    SUMMARY_KEY,
    VERSION,
    VERSIONS,
    Batch,
    Header,
    PayloadError,
)

__all__ = ["from_document", "schema"]

_SPECIAL = {"NaN": math.nan, "+Inf": math.inf, "-Inf": -math.inf}

_REQUIRED_TOP_KEYS = frozenset(
    ("format", "version", "node", "boot", "first_seq", "last_seq", "seq", "time_ms", "metrics", "devices")
)
_TOP_KEYS = _REQUIRED_TOP_KEYS | {"summary_ms", "part", "health"}
_DEVICE_KEYS = frozenset(("id", "info", "up", "columns"))


def from_document(doc: Any) -> Batch:
    """Validate a parsed JSON document and build the batch (PayloadError when invalid)."""
    header = read_header(doc)
    node, boot, seqs, times = header.node, header.boot, header.seqs, header.times_ms
    n = len(seqs)

    metrics = read_metrics(doc["metrics"], bool(header.summary_ms))
    per_sample: list[list[DeviceSample]] = [[] for _ in range(n)]
    seen: set[DeviceId] = set()
    for d, raw in enumerate(doc["devices"]):
        where = f"devices[{d}]"
        device, info, up, cols = read_device(where, raw, n, len(metrics), seen)
        decoded = read_columns(where, cols, n, header.version)
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
    health = read_health(doc)
    return Batch(node=node, boot=boot, samples=samples, summary_ms=header.summary_ms, part=header.part, health=health)


def read_header(doc: Any) -> Header:
    """The checks of the fields outside ``devices`` (and that ``metrics`` and ``devices`` are arrays): what
    ``peek`` reads."""
    if not isinstance(doc, dict):
        raise PayloadError(f"payload must be a JSON object, not {_jtype(doc)}")
    if doc.get("format") != FORMAT:
        raise PayloadError(f"payload format is {doc.get('format')!r}, expected {FORMAT!r}")
    version = doc.get("version")
    if version not in VERSIONS or isinstance(version, bool) or not isinstance(version, int):
        raise PayloadError(f"unsupported payload version {version!r} (this reader knows 1, 2 and 3)")
    _keys("payload", doc, _TOP_KEYS if version >= 3 else _REQUIRED_TOP_KEYS, _REQUIRED_TOP_KEYS)
    summary_ms = _int("summary_ms", doc["summary_ms"]) if "summary_ms" in doc else 0
    if "summary_ms" in doc and not 0 < summary_ms <= MAX_WINDOW_MS:
        raise PayloadError(f"summary_ms must be 1 to {MAX_WINDOW_MS}, got {summary_ms}")
    part = doc.get("part", "")
    if "part" in doc and (not isinstance(part, str) or not PART.match(part)):
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


def read_device(
    where: str, raw: Any, n: int, n_metrics: int, seen: set[DeviceId]
) -> tuple[DeviceId, dict[str, str], list[int | None], list[Any]]:
    """The checks of one entry of ``devices`` but its columns: its id (not one in ``seen``, to which it is
    added), info, ``up`` (``n`` entries) and that it has ``n_metrics`` columns. Shared by
    ``from_document`` and the bridge's columnar reader, so that both refuse alike."""
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
    if not (set(map(type, up)) <= _UP_TYPES and set(up) <= _UP_VALUES):  # the usual case, checked in C
        for v in up:
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v not in (0, 1)):
                raise PayloadError(f"{where}.up entries must be 1, 0 or null, got {v!r}")
    cols = raw["columns"]
    if not isinstance(cols, list) or len(cols) != n_metrics:
        raise PayloadError(f"{where}.columns must be an array of {n_metrics} entries (one per metric)")
    return device, info, up, cols


_UP_TYPES = {int, type(None)}
_UP_VALUES = {0, 1, None}


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
    if (not value and not allow_empty) or len(value) > MAX_TEXT:
        raise PayloadError(f"{where} must be 1 to {MAX_TEXT} characters")
    return value


def _int(where: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise PayloadError(f"{where} must be an integer, not {_jtype(value)}")
    if abs(value) >= SAFE_INT:
        raise PayloadError(f"{where} is out of range")
    return value


def _undelta(where: str, value: Any) -> list[int]:
    if not isinstance(value, list):
        raise PayloadError(f"{where} must be an array, not {_jtype(value)}")
    out: list[int] = []
    total = 0
    for v in value:
        total += _int(where, v)
        if abs(total) >= SAFE_INT:
            raise PayloadError(f"{where} runs out of range")
        out.append(total)
    return out


def read_metrics(value: Any, summary: bool = False) -> list[SeriesKey]:
    if not isinstance(value, list):
        raise PayloadError(f"metrics must be an array, not {_jtype(value)}")
    out: list[SeriesKey] = []
    for j, item in enumerate(value):
        where = f"metrics[{j}]"
        if not isinstance(item, list) or len(item) != 2:
            raise PayloadError(f"{where} must be [key, [label values]]")
        key, labels = item
        if not isinstance(key, str) or not (SUMMARY_KEY if summary else KEY).match(key) or len(key) > 128:
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
    _keys(f"{where}.id", value, frozenset(ID_FIELDS), {"gpu", "uuid"})
    fields = {
        name: _text(f"{where}.id.{name}", value[name], allow_empty=name not in ("gpu", "uuid"))
        for name in ID_FIELDS
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


def read_columns(where: str, cols: list[Any], n: int, version: int) -> list[list[float | None] | None]:
    """A device's columns, decoded in order (a reference names an earlier one)."""
    out: list[list[float | None] | None] = []
    for j, col in enumerate(cols):
        out.append(None if col is None else read_column(f"{where}.columns[{j}]", col, n, version, out))
    return out


def read_column(
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
    if not 0 <= form < 2 * HAS_STEP:
        raise PayloadError(f"{where}: a delta array starts with its form, 0 to {2 * HAS_STEP - 1}")
    has_step = form >= HAS_STEP
    if len(value) != n + 1 + has_step:
        raise PayloadError(f"{where} must hold the form, {'the step, ' if has_step else ''}and {n} deltas")
    step = _int(f"{where}[1]", value[1]) if has_step else 1
    if step < 1:
        raise PayloadError(f"{where}: step must be 1 or more, got {step}")
    form %= HAS_STEP
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
        if any(abs(v) >= 2 * SAFE_INT for v in deltas):
            raise PayloadError(f"{where} runs out of range")
    p = 10**scale
    out: list[float | None] = []
    total = 0
    for v in deltas:
        if v is None:
            out.append(None)
            continue
        total += v if order == 2 else _int(where, v)
        if abs(total * step) >= SAFE_INT:
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

    text = resources.files("gpu_exporter.payload").joinpath("payload.schema.json").read_text("utf-8")
    result: dict[str, Any] = json.loads(text)
    return result
