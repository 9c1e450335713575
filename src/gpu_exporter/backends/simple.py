"""Readings that take one vendor call (or one sysfs read) each, written as data.

A ``Simple`` row names the catalog key it fills, the call that answers it and how the answer becomes the
catalog's base unit: the field of the answer that holds the value (``a.b`` for a nested record), a
scale and a divisor (``raw * scale / divide``; both, so that a row writes the conversion the way the
vendor documents the unit, and ``x / 1000`` stays bit for bit what the code computed before), the raw
values that are readings, and coded levels (a PCIe rate in MT/s that stands for a generation).

Each backend keeps its rows in one table, grouped by the catalog group of their keys (``by_group``,
checked against the catalog when the module loads), and supplies how a row's call is made: its guarded
vendor call (``_calls.CallGuard``: unsupported, missing and lost as for any other call) or a sysfs read.
``read`` makes each distinct call once per group, so several rows may read fields of one answer.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.model import SeriesKey

__all__ = ["Simple", "by_group", "number", "put", "read"]

Number = Callable[[Any], "float | None"]


@dataclass(frozen=True, slots=True)
class Simple:
    """One catalog key from one call: ``values[(key, labels)] = answer[.field] * scale / divide``."""

    key: str  # the catalog key it fills
    call: str  # the vendor function, or the name of the sysfs read; errors are counted under it
    args: tuple[Any, ...] = ()  # after the device handle; the backend resolves symbolic ones
    field: str = ""  # the answer's key or attribute holding the value ("" the answer itself, "a.b" nested)
    scale: float = 1.0
    divide: float = 1.0
    low: float = -math.inf  # raw values outside [low, high] are not readings ...
    high: float = math.inf
    strict: bool = False  # ... and, when strict, count an error under ``call`` (a garbled sysfs file)
    levels: tuple[tuple[int, float], ...] = ()  # a coded raw value -> its reading; other codes are absent
    labels: tuple[str, ...] = ()  # values of the catalog entry's dynamic labels
    variant: str = ""  # tells apart uses of one function whose support differs (a sensor, a clock domain)
    # Worked out once, not at each reading: rows with the same ident share one call per cycle; the field's
    # path; the levels as a mapping; whether the value is taken as it is (no scale, divide or levels).
    ident: tuple[str, tuple[Any, ...], str] = dataclasses.field(init=False, repr=False, compare=False)
    path: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    coded: Mapping[int, float] = dataclasses.field(init=False, repr=False, compare=False)
    plain: bool = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ident", (self.call, self.args, self.variant))
        object.__setattr__(self, "path", tuple(self.field.split(".")) if self.field else ())
        object.__setattr__(self, "coded", dict(self.levels))
        object.__setattr__(self, "plain", not self.levels and self.scale == 1.0 and self.divide == 1.0)


def by_group(*rows: Simple) -> dict[str, tuple[Simple, ...]]:
    """The rows by the catalog group of their key, in order; a row the catalog contradicts is a ValueError."""
    out: dict[str, list[Simple]] = {}
    for row in rows:
        try:
            metric = catalog.by_key(row.key)
        except KeyError:
            raise ValueError(f"simple read {row.call} -> {row.key!r}: no such catalog key") from None
        if len(row.labels) != len(metric.labels):
            raise ValueError(
                f"simple read {row.call} -> {row.key!r}: {len(row.labels)} label value(s) for the "
                f"catalog's {len(metric.labels)} ({', '.join(metric.labels) or 'none'})"
            )
        if row.divide == 0 or not math.isfinite(row.scale) or not math.isfinite(row.divide):
            raise ValueError(f"simple read {row.call} -> {row.key!r}: scale and divide must be finite, divide not 0")
        if not row.low <= row.high:
            raise ValueError(f"simple read {row.call} -> {row.key!r}: low {row.low} is above high {row.high}")
        out.setdefault(metric.group, []).append(row)
    return {group: tuple(group_rows) for group, group_rows in out.items()}


def number(value: Any, sentinels: frozenset[int] = frozenset()) -> float | None:
    """A reading as a float; None for None, "N/A", booleans, ``sentinels`` and anything not a finite number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if value in sentinels else float(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


class _WrongShape(Exception):
    """The answer is not the record the row reads a field of."""


class _Invalid(Exception):
    """A strict row's raw value is out of its range."""


def _field(answer: Any, path: tuple[str, ...]) -> Any:
    """The field of a record: a mapping's key (amdsmi's dicts) or an object's attribute (NVML's structs)."""
    for name in path:
        if answer is None:
            return None
        if type(answer) is dict or isinstance(answer, Mapping):
            answer = answer.get(name)
        elif isinstance(answer, (str, bytes, int, float)) or not hasattr(answer, name):
            raise _WrongShape(name)
        else:
            answer = getattr(answer, name)
    return answer


def _value(row: Simple, answer: Any, convert: Number) -> float | None:
    """The row's value from the call's answer; None when there is none. Raises _WrongShape and _Invalid."""
    raw = convert(_field(answer, row.path) if row.path else answer)
    if raw is None:
        return None
    if not row.low <= raw <= row.high:
        if row.strict:
            raise _Invalid
        return None
    if row.plain:
        return float(raw)  # what raw * 1.0 / 1.0 is, bit for bit
    if row.levels:
        return row.coded.get(int(raw))
    return raw * row.scale / row.divide


def put(row: Simple, answer: Any, values: dict[SeriesKey, float], errors: Counter[str], convert: Number) -> bool:
    """Write ``row``'s value from the call's ``answer`` (None: unavailable) into ``values``.

    A raw value the row does not take for a reading is left out (and counted when the row is strict); so
    is an answer of the wrong shape (a field read from what is not a record): counted, and True returned.
    """
    try:
        value = _value(row, answer, convert)
    except _WrongShape:
        errors[row.call] += 1
        return True
    except _Invalid:
        errors[row.call] += 1
        return False
    if value is not None:
        values[(row.key, row.labels)] = value
    return False


def read(
    rows: Iterable[Simple],
    fetch: Callable[[Simple], Any],
    values: dict[SeriesKey, float],
    errors: Counter[str],
    convert: Number = number,
) -> None:
    """Each row's value from ``fetch(row)`` (the call's answer, None when unavailable), one call per ident.

    A wrong-shaped answer counts one error for its call, however many rows read it.
    """
    answers: dict[tuple[str, tuple[Any, ...], str], Any] = {}
    for row in rows:
        ident = row.ident
        if ident not in answers:
            answers[ident] = fetch(row)
        if put(row, answers[ident], values, errors, convert):
            answers[ident] = None  # counted once: the call's other rows find nothing
