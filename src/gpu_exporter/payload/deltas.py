"""The bridge's reader of integer-delta columns (payload/columns.py): one device's delta columns decoded
together, by a few C-level passes over all of them, instead of a Python loop per value."""

from __future__ import annotations

import itertools
import operator
from typing import Any

from gpu_exporter.payload.types import MAX_SCALE, SAFE_INT

__all__ = ["POWERS", "Deltas"]

POWERS = [10**k for k in range(MAX_SCALE + 1)]  # the divisor of each scale
_INT = {int}
# Every value of a delta column decoded here within ±_BOUND; wider ones go to the codec's own reader.
_BOUND = SAFE_INT // 4
_FIRST = operator.itemgetter(0)
_LAST = operator.itemgetter(-1)


class Deltas:
    """One device's integer-delta columns, decoded together.

    ``add`` takes a column's deltas (a copy: second-order ones are summed once in place, back to
    first-order deltas); ``decode`` turns every column's deltas into its values, running totals times
    the column's step, and checks them all at once: each column's last value is an int (a float delta
    makes every later total a float, a null or any other JSON value fails the sum or makes a total that
    is not an int), barring a boolean, and every value is within ±2**51 (a column whose deltas after
    the first are none negative has its extremes at its ends). Then every value is below the codec's
    2**53, and so is every delta and every first-order delta of a second-order column, each a
    difference of two totals. A column that fails goes to the codec's own reader."""

    __slots__ = ("bools", "counters", "lists", "positions", "scales", "steps")

    def __init__(self, bools: bool) -> None:
        self.bools = bools
        # per column, those with a step of 1 first (index 0), then the others (index 1)
        self.positions: tuple[list[int], list[int]] = ([], [])
        self.lists: tuple[list[list[Any]], list[list[Any]]] = ([], [])  # first-order deltas
        self.steps: list[int] = []  # of those with a step above 1
        self.scales: tuple[list[int], list[int]] = ([], [])  # 10 ** scale
        self.counters: tuple[list[bool], list[bool]] = ([], [])

    def add(self, j: int, deltas: list[Any], scale: int, step: int, second: bool, counter: bool) -> bool:
        if second and deltas:
            if self.bools and not set(map(type, deltas)) <= _INT:  # the sum would hide a boolean
                return False
            try:
                deltas[1:] = itertools.accumulate(deltas[1:])
            except TypeError:
                return False
        i = step != 1
        if i:
            self.steps.append(step)
        self.positions[i].append(j)
        self.lists[i].append(deltas)
        self.scales[i].append(POWERS[scale])
        self.counters[i].append(counter)
        return True

    def __bool__(self) -> bool:
        return bool(self.positions[0] or self.positions[1])

    def decode(self, out: list[list[float | None] | None], left: list[int]) -> bool:
        """Every column into ``out`` (those that fail the checks into ``left``); True when every
        counter column is known not to go down."""
        lists = self.lists[0] + self.lists[1]
        repeat, accumulate, islice = itertools.repeat, itertools.accumulate, itertools.islice
        try:
            values: list[list[Any]] = list(map(list, map(accumulate, self.lists[0])))
            values += map(list, map(map, repeat(operator.mul), map(accumulate, self.lists[1]), map(repeat, self.steps)))
            if len(lists[0]) > 1:  # whether each column's deltas after its first are none negative
                rising = list(map(operator.ge, map(min, map(islice, lists, repeat(1), repeat(None))), repeat(0)))
            else:
                rising = [True] * len(lists)
            others = list(itertools.compress(values, map(operator.not_, rising)))
            ordered = list(itertools.compress(values, rising))
            ok = (
                set(map(type, map(_LAST, values))) == _INT
                and max(map(max, others), default=0) < _BOUND
                and min(map(min, others), default=0) > -_BOUND
                and max(map(_LAST, ordered), default=0) < _BOUND
                and min(map(_FIRST, ordered), default=0) > -_BOUND
                and (not self.bools or set(map(type, itertools.chain.from_iterable(lists))) <= _INT)
            )
        except (TypeError, ValueError):  # a null or a string among them; an empty list
            ok = False
        if not ok:
            return self._one_by_one(out, left)
        scales = self.scales[0] + self.scales[1]
        for k in itertools.compress(range(len(scales)), map(operator.ne, scales, repeat(1))):
            values[k] = list(map(operator.truediv, values[k], repeat(scales[k])))  # else ints: the same as floats
        for j, col in zip(self.positions[0] + self.positions[1], values, strict=True):
            out[j] = col
        # a step of at least 1 and a positive divisor keep the order
        return all(itertools.compress(rising, self.counters[0] + self.counters[1]))

    def _one_by_one(self, out: list[list[float | None] | None], left: list[int]) -> bool:
        """``decode``, column by column, when the columns failed it together."""
        keep = Deltas(False)
        columns = zip(
            self.positions[0] + self.positions[1],
            self.lists[0] + self.lists[1],
            [1] * len(self.lists[0]) + self.steps,
            self.scales[0] + self.scales[1],
            self.counters[0] + self.counters[1],
            strict=True,
        )
        for j, deltas, step, p, counter in columns:
            try:
                values = list(itertools.accumulate(deltas))
                ok = (
                    type(values[-1]) is int
                    and max(values) * step < _BOUND
                    and min(values) * step > -_BOUND
                    and (not self.bools or set(map(type, deltas)) <= _INT)
                )
            except (TypeError, ValueError, IndexError):
                ok = False
            if ok:
                keep.add(j, deltas, len(str(p)) - 1, step, False, counter)
            else:
                left.append(j)
        return keep.decode(out, left) if keep else True


_FIRST = operator.itemgetter(0)
_LAST = operator.itemgetter(-1)
