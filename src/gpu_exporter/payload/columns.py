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
from gpu_exporter.payload.document import read_column, read_device, read_header
from gpu_exporter.payload.frame import INFLATE_FLOOR, INFLATE_RATIO, inflate_limit, parse_text, unframe
from gpu_exporter.payload.types import DEFAULT_MAX_BYTES, HAS_STEP, MAX_SCALE, SAFE_INT, PayloadError

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
    return dataclasses.replace(from_document(_parse(text)), text_bytes=len(text))


def from_document(doc: Any) -> ColumnBatch:
    """The checks of ``document.from_document``, in the same order, keeping the columns."""
    header = read_header(doc)  # format, version, fields, node, boot, seq, time_ms: the codec's own checks
    node, boot, seqs, times = header.node, header.boot, list(header.seqs), list(header.times_ms)
    n = len(seqs)
    metrics, counters = _metrics(doc["metrics"], bool(header.summary_ms))
    devices: list[ColumnDevice] = []
    seen: set[DeviceId] = set()
    for d, raw in enumerate(doc["devices"]):
        where = f"devices[{d}]"
        device, info, up, cols = read_device(where, raw, n, len(metrics), seen)
        decoded, nonfinite, rising, gaps = _columns(where, cols, n, header.version, counters)
        if None in up:
            for i, flag in enumerate(up):
                if flag is None and any(col is not None and col[i] is not None for col in decoded):
                    raise PayloadError(f"{where} has values in sample {seqs[i]} where it is absent (up null)")
        devices.append(ColumnDevice(device, dict(info), up, decoded, gaps, nonfinite, rising))
    batch = ColumnBatch(node, boot, seqs, times, metrics, devices, header.summary_ms, part=header.part)
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


def _columns(
    where: str, cols: list[Any], n: int, version: int, counters: frozenset[int] = frozenset()
) -> tuple[list[list[float | None] | None], bool, bool, bool]:
    """Every column of one device, whether one may hold NaN or ±Inf, whether every column at a
    position of ``counters`` is known not to go down, and whether a column holds a null (only the
    codec's own ``read_column`` can make one). Plain integer-delta columns and finite constants
    (the encoder's usual output) are checked together and decoded in C loops; any other column (plain
    values, a reference, a non-finite constant) goes through the codec's own ``read_column``, in order,
    after them."""
    fast: list[tuple[int, list[int], int, int, int]] = []  # (position, deltas, scale, step, order)
    out: list[list[float | None] | None] = [None] * len(cols)
    done = set()
    plain: set[int] = set()  # plain-value columns decoded here
    has_step = HAS_STEP
    v3 = version >= 3
    plain_len, stepped_len = n + 1, n + 2
    for j, col in enumerate(cols):
        kind = type(col)
        if kind is list and v3:  # [form, (step), deltas...]
            if not col:
                continue
            form = col[0]
            if type(form) is not int or not 0 <= form < 2 * has_step:
                continue
            if form < has_step:
                if len(col) == plain_len:
                    fast.append((j, col[1:], form % 10, 1, 1 + form // 10))
                continue
            step = col[1] if len(col) == stepped_len else None
            if type(step) is not int or not 1 <= step < _SAFE:
                continue
            form -= has_step
            fast.append((j, col[2:], form % 10, step, 1 + form // 10))
            continue
        if (kind is int or kind is float) and v3:  # a constant
            value = float(col)
            if math.isfinite(value):
                out[j] = [value] * n
                done.add(j)
            continue
        if kind is not dict:
            continue
        deltas = col.get("delta")
        if deltas is None:
            raw = col.get("values")
            # plain numbers (no null, no "NaN" strings, no bool): what _raw_value would return
            if type(raw) is list and len(col) == 1 and len(raw) == n and set(map(type, raw)) <= _NUMBER:
                floats = list(map(float, raw))
                if all(map(math.isfinite, floats)):
                    out[j] = floats  # type: ignore[assignment]
                    done.add(j)
                    plain.add(j)
            continue
        if type(deltas) is not list or len(deltas) != n or version >= 3:  # version 3 writes delta arrays
            continue
        if len(col) == 1:
            fast.append((j, deltas, 0, 1, 1))
            continue
        scale = col.get("scale", 0)
        step = col.get("step", 1)
        order = col.get("order", 1) if version >= 2 else 1
        if (
            len(col) == 1 + ("scale" in col) + ("step" in col) + ("order" in col and version >= 2)
            and type(scale) is int
            and 0 <= scale <= MAX_SCALE
            and type(step) is int
            and 1 <= step < _SAFE
            and type(order) is int
            and order in (1, 2)
        ):
            fast.append((j, deltas, scale, step, order))
    if fast:
        # Every entry an int (no bool, no null), and no running total times its step can reach the
        # codec's limit: n * largest |delta| * step bounds them all, and each delta too (n * n for
        # second-order deltas, whose running totals are summed once more). Both checks run over all
        # columns at once (map over the columns, no Python loop); only when one fails are the columns
        # sorted out one by one.
        lists = [f[1] for f in fast]
        if not (
            set(map(type, itertools.chain.from_iterable(lists))) <= _INT
            and max(
                map(operator.mul, map(max, map(max, lists), map(operator.neg, map(min, lists))), [f[3] for f in fast])
            )
            * n
            * n
            < _SAFE
        ):
            fast = [f for f in fast if set(map(type, f[1])) <= _INT and max(map(abs, f[1])) * n ** f[4] * f[3] < _SAFE]
    truediv, mul, repeat, accumulate = operator.truediv, operator.mul, itertools.repeat, itertools.accumulate
    rising = True
    for j, deltas, scale, step, order in fast:
        if order == 2:
            deltas = deltas[:1] + list(accumulate(deltas[1:]))  # back to first-order deltas
        if rising and n > 1 and j in counters:  # a step of at least 1: the values go as the deltas
            rising = min(itertools.islice(deltas, 1, None)) >= 0
        totals = accumulate(deltas) if step == 1 else map(mul, accumulate(deltas), repeat(step))
        if scale:
            out[j] = list(map(truediv, totals, repeat(10**scale)))
        else:  # ints below 2**53: the same numbers as floats, written as doubles all the same
            out[j] = list(totals)
    done.update([f[0] for f in fast])
    nonfinite = gaps = False
    # the columns left, in order (a reference names an earlier column: decoded by then)
    left: Iterable[int] = ()
    if len(done) < len(cols):
        present = itertools.compress(range(len(cols)), map(operator.is_not, cols, itertools.repeat(None)))
        left = sorted(set(present) - done)
    for j in left:
        values = out[j] = read_column(f"{where}.columns[{j}]", cols[j], n, version, out[:j])
        nonfinite = nonfinite or not all(v is None or math.isfinite(v) for v in values)
        gaps = gaps or None in values
        rising = rising and j not in counters
    if rising and plain:
        for j in sorted(plain & counters):
            values = cols[j]["values"]
            rising = rising and all(map(operator.le, values, itertools.islice(values, 1, None)))
    return out, nonfinite, rising, gaps
