"""What the bridge writes of values no sensor reads: NaN, ±Inf, and counters that go backwards.

Policy (docs/bridge.md, "Values"), each dropped value counted by node and reason:

* NaN and ±Inf, gauges and counters alike, are dropped (``nan``, ``inf``). The payload can carry them
  (``"NaN"``, ``"+Inf"``), but no GPU reading is one, and one ``+Inf`` in a counter breaks every
  ``rate()`` over it.
* A counter below zero is dropped (``negative_counter``).
* Within one boot of a node's agent a counter never goes back: a value below the highest the bridge
  saw of that series, earlier in the batch or in a batch of earlier samples, is dropped
  (``counter_backwards``). Samples are ordered by sequence number (the agent's sampling order,
  whatever its clock did or the bridge corrected), so a backlog sent after fresh data is only checked
  within itself. If a counter stays below its high mark for ``RESET_AFTER`` batches in a row, the
  bridge takes it as a reset of the device's counters within the boot (a GPU reset or a driver reload
  clears NVML's) and writes from that batch on, from the new level.
* A new boot starts every counter afresh: a reset across boots is what ``rate()`` expects.

Cost: the payload decoder already knows which columns may hold a non-finite value (only plain-value and
constant columns can), so finite columns cost nothing; each counter column costs one comparison with its
mark and one C-level pass for its order, per device per batch.
"""

from __future__ import annotations

import itertools
import math
import operator
from array import array
from collections.abc import Callable

from gpu_exporter import catalog
from gpu_exporter.model import SeriesKey

__all__ = ["COUNTER_KEYS", "RESET_AFTER", "Counters", "drop_nonfinite"]

RESET_AFTER = 3
COUNTER_KEYS = catalog.COUNTER_KEYS
Column = list[float | None]


def drop_nonfinite(columns: list[Column | None], dropped: dict[str, int]) -> bool:
    """Replace NaN and ±Inf by gaps in place, counting them in ``dropped``; True when any was found.
    Called only for a device whose decoder saw a column that may hold one."""
    found = False
    for j, col in enumerate(columns):
        if col is None:
            continue
        bad = [k for k, v in enumerate(col) if v is not None and not math.isfinite(v)]
        if not bad:
            continue
        out = list(col)
        for k in bad:
            reason = "nan" if math.isnan(col[k]) else "inf"  # type: ignore[arg-type]
            dropped[reason] = dropped.get(reason, 0) + 1
            out[k] = None
        columns[j] = out
        found = True
    return found


class Counters:
    """The counter columns of one device's metrics list, and their high marks in the current boot."""

    __slots__ = ("_take", "below", "boot", "keys", "marks", "newest_seq", "positions")

    def __init__(self) -> None:
        self.boot = ""
        self.keys: tuple[SeriesKey, ...] = ()
        self.positions: list[int] = []
        self._take: Callable[[list[Column | None]], tuple[Column | None, ...]] = lambda columns: ()
        self.marks = array("d")
        self.newest_seq = 0  # sequence number of the newest sample the marks have seen
        self.below: dict[SeriesKey, int] = {}  # batches in a row a counter stayed below its mark

    def plan(self, keys: tuple[SeriesKey, ...], positions: list[int]) -> None:
        """Follow the counters a device writes in a batch (their keys, and their columns' positions):
        usually the same as in its last batch (one comparison); the marks of those it still has are kept."""
        if positions is self.positions:
            return
        self.positions = positions
        if len(positions) == 1:
            self._take = lambda columns: (columns[positions[0]],)
        else:
            self._take = operator.itemgetter(*positions)
        if keys != self.keys:
            old = dict(zip(self.keys, self.marks, strict=True))
            self.keys = keys
            self.marks = array("d", map(old.get, keys, itertools.repeat(0.0)))

    def screen(
        self, boot: str, seqs: list[int], columns: list[Column | None], dropped: dict[str, int], rising: bool = False
    ) -> bool:
        """Drop the counter values the policy refuses, in place; True when any was dropped (a gap).
        Samples are ordered by their sequence numbers, which follow the agent's sampling whatever its
        clock did or the bridge corrected. ``rising``: the decoder found every counter column not going
        down within the batch (from its integer deltas), so only where each starts is left to check."""
        if boot != self.boot:  # a new boot: every counter starts afresh
            self.boot, self.newest_seq, self.below = boot, 0, {}
            self.marks = array("d", bytes(8 * len(self.keys)))
        newer = seqs[0] > self.newest_seq
        if self.positions and not self._in_order(columns, newer, rising):
            gaps = self._one_by_one(columns, newer, dropped)
        else:
            gaps = False
        if newer:
            self.newest_seq = seqs[-1]
        return gaps

    def _in_order(self, columns: list[Column | None], newer: bool, rising: bool) -> bool:
        """The common case, for every counter column at once without a Python loop: each in order, none
        below zero, none below its mark (for newer samples); the marks then move to the last values."""
        cols = self._take(columns)
        if None in cols:
            return False
        try:
            repeat = itertools.repeat
            tails = map(itertools.islice, cols, repeat(1), repeat(None))  # type: ignore[arg-type]
            if not rising and not all(map(all, map(map, repeat(operator.le), cols, tails))):  # type: ignore[arg-type]
                return False
            firsts = map(operator.itemgetter(0), cols)  # type: ignore[arg-type]
            if not all(map(operator.ge, firsts, self.marks if newer else repeat(0.0))):
                return False
        except TypeError:  # a gap (None) in a column
            return False
        if newer:
            self.marks = array("d", map(operator.itemgetter(-1), cols))  # type: ignore[arg-type]
            if self.below:
                self.below.clear()
        return True

    def _one_by_one(self, columns: list[Column | None], newer: bool, dropped: dict[str, int]) -> bool:
        marks, le, islice = self.marks, operator.le, itertools.islice
        gaps = False
        cols = self._take(columns)
        for i in itertools.compress(range(len(cols)), map(operator.is_not, cols, itertools.repeat(None))):
            j, col = self.positions[i], cols[i]
            assert col is not None
            start = marks[i] if newer else 0.0
            try:
                if col[0] >= start and all(map(le, col, islice(col, 1, None))):  # type: ignore[operator,arg-type]
                    if newer:
                        marks[i] = col[-1]  # type: ignore[assignment]
                        self.below.pop(self.keys[i], None)
                    continue
            except TypeError:  # a gap (None)
                pass
            gaps |= self._slow(i, col, start, newer, columns, j, dropped)
        return gaps

    def _slow(
        self,
        i: int,
        col: Column,
        start: float,
        newer: bool,
        columns: list[Column | None],
        j: int,
        dropped: dict[str, int],
    ) -> bool:
        present = [v for v in col if v is not None]
        key = self.keys[i]
        if (
            newer
            and present
            and min(present) >= 0
            and present[-1] < start
            and all(map(operator.le, present, present[1:]))
        ):  # wholly below its mark, in order: a reset within the boot, once it lasts
            streak = self.below[key] = self.below.get(key, 0) + 1
            if streak >= RESET_AFTER:
                del self.below[key]
                self.marks[i] = present[-1]
                dropped["counter_reset"] = dropped.get("counter_reset", 0) + 1  # not a drop: said in the log
                return False
        out: Column = []
        high = start
        for v in col:
            if v is not None:
                if v < 0:
                    dropped["negative_counter"] = dropped.get("negative_counter", 0) + 1
                    v = None
                elif v < high:
                    dropped["counter_backwards"] = dropped.get("counter_backwards", 0) + 1
                    v = None
                else:
                    high = v
            out.append(v)
        columns[j] = out
        if newer:
            self.marks[i] = high
        return True
