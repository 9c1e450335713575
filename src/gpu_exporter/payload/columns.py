"""The payload codec's decode, columnar: what the bridge reads instead of per-sample objects.

``gpu_exporter.payload.decode`` builds a ``Sample`` with a dict of values per device per sample,
which is what the exporter side needs. The bridge needs the opposite shape, one column per series, and
the payload already is one. Reading the columns directly skips building and then taking apart ~90
dict entries per GPU-sample, which is most of the bridge's CPU time.

The same codec decides what is valid: this module calls the codec's own field validators and, for every
column that is not a plain integer-delta column, the codec's own column decoder. tests/
test_bridge_columns.py checks with hypothesis that ``read`` accepts exactly what ``decode.decode``
accepts and yields the same values, with one deliberate exception: text that has no UTF-8 form (a lone
surrogate written as a JSON escape) is rejected here, because it could never be sent as a label.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.model import DeviceId, SeriesKey
from gpu_exporter.payload import document
from gpu_exporter.payload.deltas import POWERS, Deltas
from gpu_exporter.payload.document import read_column, read_device, read_header
from gpu_exporter.payload.frame import INFLATE_FLOOR, INFLATE_RATIO, inflate_limit, parse_text, unframe
from gpu_exporter.payload.health import read_health
from gpu_exporter.payload.types import DEFAULT_MAX_BYTES, HAS_STEP, MAX_SCALE, SAFE_INT, HealthValue, PayloadError

__all__ = ["INFLATE_FLOOR", "INFLATE_RATIO", "ColumnBatch", "ColumnDevice", "inflate_limit", "read"]

_SAFE = SAFE_INT
try:  # optional: a faster JSON parser
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class ColumnDevice:
    device: DeviceId
    info: dict[str, str]
    up: list[int | None]  # per sample: 1, 0, or None when the device is absent from that sample
    columns: list[list[float | None] | None]  # per metric (``ColumnBatch.metrics``), per sample
    gaps: bool = False  # some column holds a null (a value missing from some sample)
    nonfinite: bool = False  # some column holds NaN or ±Inf (only plain values and constants can)
    # every counter column (catalog type counter) is known not to go down within the batch: a constant,
    # or integer deltas none of which after the first is negative (bridge/values.py checks the rest)
    counters_rising: bool = False


@dataclass(frozen=True, slots=True)
class ColumnBatch:
    node: str
    boot: str
    seqs: list[int]
    times_ms: list[int]
    metrics: Sequence[SeriesKey]
    devices: list[ColumnDevice]
    summary_ms: int = 0  # a summary batch (forward/summary.py): min/max/mean/last per window of this many ms
    text_bytes: int = 0  # size of the JSON text it was read from: what decoding it cost in memory, roughly
    part: str = ""  # some devices or series of its samples only (payload/split.py): the part's name
    health: tuple[HealthValue, ...] = ()  # a health report (payload/health.py): the agent's own metrics


def read(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> ColumnBatch:
    """The batch in ``data``, as columns. Raises PayloadError, and only that, when invalid."""
    try:
        return _read(data, max_bytes)
    except PayloadError:
        raise
    except Exception as exc:  # same promise as the codec: nothing else escapes
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}") from None


def _parse(text: bytes) -> Any:
    """JSON with orjson when it is installed (it parses a batch in about two thirds of the time), else
    with the standard library exactly as the codec does. Both refuse NaN and Infinity literals, invalid
    UTF-8 and runaway nesting. orjson reads an integer beyond 64 bits as a float (the standard library as
    an int): the codec's range checks refuse it where a delta is expected, and elsewhere (a constant,
    plain values, a reference's "add") both give the same float. It refuses lone surrogates, which
    _check_encodable refuses here too."""
    if _orjson is not None:
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError as exc:
            raise PayloadError(f"payload is not JSON: {' '.join(str(exc).split())[:200]}") from None
    return parse_text(text)


def _read(data: bytes, max_bytes: int) -> ColumnBatch:
    text = unframe(data, max_bytes, ratio_bound=True)
    bools = b"true" in text or b"false" in text  # (only a JSON literal can make a boolean)
    return dataclasses.replace(from_document(_parse(text), bools), text_bytes=len(text))


def from_document(doc: Any, bools: bool = True) -> ColumnBatch:
    """The checks of ``document.from_document``, in the same order, keeping the columns. ``bools``:
    the document may hold a boolean (False only when its JSON text has no ``true`` or ``false``)."""
    header = read_header(doc)  # format, version, fields, node, boot, seq, time_ms: the codec's own checks
    node, boot, seqs, times = header.node, header.boot, list(header.seqs), list(header.times_ms)
    n = len(seqs)
    metrics, counters = _metrics(doc["metrics"], bool(header.summary_ms))
    devices: list[ColumnDevice] = []
    seen: set[DeviceId] = set()
    for d, raw in enumerate(doc["devices"]):
        where = f"devices[{d}]"
        device, info, up, cols = read_device(where, raw, n, len(metrics), seen)
        decoded, nonfinite, rising, gaps = _columns(where, cols, n, header.version, counters, bools)
        if None in up:
            for i, flag in enumerate(up):
                if flag is None and any(col is not None and col[i] is not None for col in decoded):
                    raise PayloadError(f"{where} has values in sample {seqs[i]} where it is absent (up null)")
        devices.append(ColumnDevice(device, dict(info), up, decoded, gaps, nonfinite, rising))
    health = read_health(doc)
    batch = ColumnBatch(node, boot, seqs, times, metrics, devices, header.summary_ms, part=header.part, health=health)
    _check_encodable(batch)
    return batch


# The metrics lists checked last (a fleet sends a few layouts, each in every message): a list equal to one
# of them (a comparison in C) is not checked again, and yields the same tuple, which the converter then
# finds its plan by without hashing it.
_LAYOUTS: list[tuple[bool, list[Any], tuple[SeriesKey, ...], frozenset[int]]] = []
_MAX_LAYOUTS = 8
_LAYOUT_LIMIT = 4096  # series keys in a list kept (an 8-GPU node with MIG and XIDs: a few hundred)


def _metrics(raw: Any, summary: bool) -> tuple[tuple[SeriesKey, ...], frozenset[int]]:
    """The codec's check of a batch's metrics list, and the positions of counters in it."""
    for i, (was_summary, was, metrics, counters) in enumerate(_LAYOUTS):
        if was_summary == summary and was == raw:
            if i:
                _LAYOUTS.insert(0, _LAYOUTS.pop(i))
            return metrics, counters
    metrics = tuple(document.read_metrics(raw, summary))
    counters = frozenset(j for j, (key, _) in enumerate(metrics) if key in catalog.COUNTER_KEYS)  # does each go up?
    if len(metrics) <= _LAYOUT_LIMIT:  # a flood's list of series is not kept (8 of them: hundreds of MB)
        _LAYOUTS.insert(0, (summary, raw, metrics, counters))
        del _LAYOUTS[_MAX_LAYOUTS:]
    return metrics, counters


def _check_encodable(batch: ColumnBatch) -> None:
    """Strings become label values, which remote write carries as UTF-8: a lone surrogate (a JSON
    escape like \\ud800) would only fail later, in the middle of a write."""
    texts = [batch.node, batch.boot]
    for _, labels in batch.metrics:
        texts.extend(labels)
    for dev in batch.devices:
        texts.extend(value for pair in dev.device.labels() for value in pair)
        texts.extend(dev.info)
        texts.extend(dev.info.values())
    try:
        "\0".join(texts).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PayloadError(f"payload text is not valid UTF-8 ({exc.reason})") from None


_INT = {int}
_NUMBER = {int, float}
_REF_KEYS = frozenset(("ref", "sign", "add"))


def _columns(
    where: str, cols: list[Any], n: int, version: int, counters: frozenset[int] = frozenset(), bools: bool = True
) -> tuple[list[list[float | None] | None], bool, bool, bool]:
    """Every column of one device, whether one may hold NaN or ±Inf, whether every column at a
    position of ``counters`` is known not to go down, and whether a column holds a null (only the
    codec's own ``read_column`` can make one).

    Integer-delta columns (the encoder's usual output), finite constants and plain finite values are
    decoded here, the delta columns all together by a few C-level passes (``Deltas``); any other
    column (a reference, a column with a null or a value out of the usual range, anything invalid) goes
    through the codec's own ``read_column``, in order, after them, so that it is refused in the codec's
    own words. ``bools``: the JSON text may hold ``true`` or ``false`` (a boolean is an int to Python's
    arithmetic, and the codec refuses one where it wants an integer)."""
    out: list[list[float | None] | None] = [None] * len(cols)
    fast = Deltas(bools)
    left: list[int] = []  # for read_column
    plain: list[int] = []  # plain-value columns decoded here
    if version >= 3:
        _version_3(cols, n, counters, fast, out, left, plain)
        cols_left: Iterable[tuple[int, Any]] = ()
    else:
        cols_left = enumerate(cols)
    for j, col in cols_left:  # versions 1 and 2
        kind = type(col)
        if col is None:
            continue
        if kind is not dict:
            left.append(j)
            continue
        deltas = col.get("delta")
        if deltas is None:
            raw = col.get("values")
            # plain numbers (no null, no "NaN" strings, no bool): what _raw_value would return
            if type(raw) is list and len(col) == 1 and len(raw) == n and set(map(type, raw)) <= _NUMBER:
                floats = list(map(float, raw))
                if all(map(math.isfinite, floats)):
                    out[j] = floats  # type: ignore[assignment]
                    plain.append(j)
                    continue
            left.append(j)
            continue
        scale = col.get("scale", 0)
        step = col.get("step", 1)
        order = col.get("order", 1) if version >= 2 else 1
        if not (
            type(deltas) is list
            and len(deltas) == n
            and len(col) == 1 + ("scale" in col) + ("step" in col) + ("order" in col and version >= 2)
            and type(scale) is int
            and 0 <= scale <= MAX_SCALE
            and type(step) is int
            and 1 <= step < _SAFE
            and type(order) is int
            and order in (1, 2)
            and fast.add(j, list(deltas), scale, step, order == 2, j in counters)
        ):
            left.append(j)
    rising = fast.decode(out, left) if fast else True
    v3 = version >= 3
    nonfinite = gaps = False
    if left:
        left.sort()  # in order: a reference names an earlier column, decoded by then
        for j in left:
            col = cols[j]
            values = out[j] = _reference(col, out, j) if v3 and type(col) is dict else None
            if values is None:
                values = out[j] = read_column(f"{where}.columns[{j}]", col, n, version, out[:j])
                gaps = gaps or None in values
            nonfinite = nonfinite or not all(v is None or math.isfinite(v) for v in values)
            rising = rising and j not in counters
    if rising and plain:
        for j in plain:
            if j in counters:
                values = cols[j]["values"]
                rising = rising and all(map(operator.le, values, itertools.islice(values, 1, None)))
    return out, nonfinite, rising, gaps


def _version_3(
    cols: list[Any],
    n: int,
    counters: frozenset[int],
    fast: Deltas,
    out: list[list[float | None] | None],
    left: list[int],
    plain: list[int],
) -> None:
    """``_columns``'s sorting of a version 3 device's columns: constants decoded, delta arrays to
    ``fast``, plain values decoded (their positions in ``plain``), the rest to ``left``. The usual
    first-order delta array is taken in line, without a call."""
    has_step, plain_len, stepped_len = HAS_STEP, n + 1, n + 2
    isfinite = math.isfinite
    positions, lists, scales, flags = fast.positions[0], fast.lists[0], fast.scales[0], fast.counters[0]
    for j, col in enumerate(cols):
        kind = type(col)
        if kind is list:  # [form, (step), deltas...]
            form = col[0] if col else -1
            if type(form) is int:
                if 0 <= form < 10 and len(col) == plain_len:  # first order, no step
                    positions.append(j)
                    lists.append(col[1:])
                    scales.append(POWERS[form])
                    flags.append(j in counters)
                    continue
                if 0 <= form < has_step:
                    if len(col) == plain_len and fast.add(j, col[1:], form % 10, 1, True, j in counters):
                        continue
                elif has_step <= form < 2 * has_step and len(col) == stepped_len:
                    step = col[1]
                    if (
                        type(step) is int
                        and 1 <= step < _SAFE
                        and fast.add(j, col[2:], form % 10, step, form >= has_step + 10, j in counters)
                    ):
                        continue
            left.append(j)
        elif kind is int or kind is float:  # a constant
            value = float(col)
            if isfinite(value):
                out[j] = [value] * n
            else:
                left.append(j)
        elif kind is dict:
            raw = col.get("values")
            # plain numbers (no null, no "NaN" strings, no bool): what _raw_value would return
            if type(raw) is list and len(col) == 1 and len(raw) == n and set(map(type, raw)) <= _NUMBER:
                floats = list(map(float, raw))
                if all(map(isfinite, floats)):
                    out[j] = floats  # type: ignore[assignment]
                    plain.append(j)
                    continue
            left.append(j)
        elif col is not None:
            left.append(j)


def _reference(col: dict[str, Any], out: list[list[float | None] | None], j: int) -> list[float | None] | None:
    """A version 3 reference ``{"ref": r, "sign": s, "add": c}`` the codec would accept, to a column
    without nulls: ``c + s * v`` for each value ``v`` of column r, as the codec computes it. None for
    anything else (the codec's own ``read_column`` then reads it, or refuses it in its words)."""
    if "ref" not in col or not col.keys() <= _REF_KEYS:
        return None
    r = col["ref"]
    sign = col.get("sign", 1)
    add = col.get("add", 0)
    if type(r) is not int or not 0 <= r < j or type(sign) is not int or sign not in (1, -1):
        return None
    other = out[r]
    if other is None or None in other or not (type(add) is int or type(add) is float):
        return None
    try:
        c = float(add)
    except OverflowError:
        return None
    if not math.isfinite(c):
        return None
    # c + 1 * v is c + v, and c + -1 * v is c - v, to the bit (IEEE subtraction is adding the negation)
    return list(map(operator.add if sign == 1 else operator.sub, itertools.repeat(c), other))
