"""What the bridge writes of values no sensor reads: NaN, ±Inf, and counters that go backwards.

Policy (docs/bridge.md, "Values"), each dropped value counted by node and reason:

* NaN and ±Inf, gauges and counters alike, are dropped (``nan``, ``inf``). The payload can carry them
  (``"NaN"``, ``"+Inf"``), but no GPU reading is one, and one ``+Inf`` in a counter breaks every
  ``rate()`` over it.
* A counter below zero is dropped (``negative_counter``).
* Within one boot of a node's agent a counter never goes back: a value below the highest the bridge
  saw of that series (in the same batch, or in an earlier batch with older samples) is dropped
  (``counter_backwards``). A batch older than what the bridge already saw (a backlog sent after fresh
  data) is only checked within itself. If a counter stays below its high mark for ``RESET_AFTER``
  batches in a row, the bridge takes it as a reset of the device's counters within the boot (a GPU
  reset or a driver reload clears NVML's) and writes from that batch on, from the new level.
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
from collections.abc import Sequence

from gpu_exporter import catalog
from gpu_exporter.model import SeriesKey

__all__ = ["RESET_AFTER", "Counters", "drop_nonfinite"]

RESET_AFTER = 3
_COUNTER_KEYS = frozenset(m.key for m in catalog.CATALOG if m.type == "counter")
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

    __slots__ = ("below", "boot", "keys", "marks", "newest_ms", "positions")

    def __init__(self) -> None:
        self.boot = ""
        self.keys: tuple[SeriesKey, ...] = ()
        self.positions: list[int] = []
        self.marks = array("d")
        self.newest_ms = -1
        self.below: dict[SeriesKey, int] = {}  # batches in a row a counter stayed below its mark

    def plan(self, metrics: Sequence[SeriesKey]) -> None:
        """Follow a new metrics list, keeping the marks of the counters it still has."""
        keys = tuple(m for m in metrics if m[0] in _COUNTER_KEYS)
        if keys == self.keys:
            return
        old = dict(zip(self.keys, self.marks, strict=True))
        self.positions = [j for j, m in enumerate(metrics) if m[0] in _COUNTER_KEYS]
        self.keys = keys
        self.marks = array("d", (old.get(k, 0.0) for k in keys))

    def screen(self, boot: str, times: list[int], columns: list[Column | None], dropped: dict[str, int]) -> bool:
        """Drop the counter values the policy refuses, in place; True when any was dropped (a gap)."""
        if boot != self.boot:  # a new boot: every counter starts afresh
            self.boot, self.newest_ms, self.below = boot, -1, {}
            self.marks = array("d", bytes(8 * len(self.keys)))
        newer = times[0] > self.newest_ms
        marks, le = self.marks, operator.le
        gaps = False
        for i, j in enumerate(self.positions):
            col = columns[j]
            if col is None:
                continue
            start = marks[i] if newer else 0.0
            try:
                if col[0] >= start and all(map(le, col, itertools.islice(col, 1, None))):  # type: ignore[operator,arg-type]
                    if newer:
                        marks[i] = col[-1]  # type: ignore[assignment]
                        if self.below:
                            self.below.pop(self.keys[i], None)
                    continue
            except TypeError:  # a gap (None): the slow path below
                pass
            gaps |= self._slow(i, col, start, newer, columns, j, dropped)
        if newer:
            self.newest_ms = times[-1]
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
