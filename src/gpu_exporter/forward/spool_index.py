"""The spool's index: ``Entry`` (one stored batch, described by its queue key alone) and ``Index`` (the
entries, oldest first, in packed columns). Nothing here touches the disk.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["Entry", "Index", "entry_of", "fields"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored batch, described by its key alone."""

    counter: int
    created_ms: int
    size: int
    first_seq: int
    last_seq: int
    samples: int

    @property
    def key(self) -> str:
        fields = (self.created_ms, self.size, self.first_seq, self.last_seq, self.samples)
        return f"q.{self.counter:012d}." + ".".join(str(f) for f in fields)

    @classmethod
    def parse(cls, key: str) -> Entry | None:
        parts = key.split(".")
        if len(parts) != 7 or parts[0] != "q" or not all(p.isdigit() for p in parts[1:]):
            return None
        return cls(*(int(p) for p in parts[1:]))


class Index:
    """The spool's entries, oldest first, as six packed columns of ``Entry``'s fields.

    A spool at its cap holds thousands of batches (about 9 000 at the default 256 MiB with 96-sample
    batches). As a dict of key strings and ``Entry`` objects that index took about 300 bytes an entry, as
    columns it takes about 50; ``Entry`` objects are built when asked for. Counters only grow, so an
    entry's row is found by bisection; a removed entry's size is set to -1, and the columns are rebuilt
    without those rows once they outnumber the rest. Iterators find their place again by counter, so the
    index may change while one is in use.
    """

    __slots__ = ("_cols", "_head", "_live")

    def __init__(self) -> None:
        self._cols: list[array[int]] = [array("q") for _ in range(6)]  # Entry's fields, in its order
        self._head = 0  # rows before it are all removed
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def append(self, entry: Entry) -> None:
        counters = self._cols[0]
        if counters and entry.counter <= counters[-1]:
            raise ValueError(f"spool counters must grow: {entry.counter} after {counters[-1]}")
        for col, value in zip(self._cols, fields(entry), strict=True):
            col.append(value)
        self._live += 1

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, Entry) and self._row(entry) >= 0

    def remove(self, entry: Entry) -> bool:
        """Forget ``entry``; False when it is not (or no longer) here."""
        row = self._row(entry)
        if row < 0:
            return False
        sizes = self._cols[2]
        sizes[row] = -1
        self._live -= 1
        while self._head < len(sizes) and sizes[self._head] < 0:
            self._head += 1
        removed = len(sizes) - self._live
        if removed > 256 and removed > self._live:
            rows = [i for i in range(self._head, len(sizes)) if sizes[i] >= 0]
            self._cols = [array("q", [col[i] for i in rows]) for col in self._cols]
            self._head = 0
        return True

    def oldest(self) -> Entry | None:
        return self._entry(self._head) if self._head < len(self._cols[0]) else None

    def newest(self) -> Entry | None:
        sizes = self._cols[2]
        for row in range(len(sizes) - 1, self._head - 1, -1):
            if sizes[row] >= 0:
                return self._entry(row)
        return None

    def __iter__(self) -> Iterator[Entry]:
        """Oldest first, up to the newest entry of the moment it is called."""
        counters = self._cols[0]
        if not counters:
            return
        last = counters[-1]
        row = self._head
        while True:
            counters, sizes = self._cols[0], self._cols[2]
            while row < len(sizes) and sizes[row] < 0:
                row += 1
            if row >= len(counters) or counters[row] > last:
                return
            entry = self._entry(row)
            yield entry
            row = bisect_right(self._cols[0], entry.counter, self._head)  # the columns may have changed

    def _row(self, entry: Entry) -> int:
        """The row holding ``entry`` (all fields equal), or -1."""
        counters = self._cols[0]
        row = bisect_left(counters, entry.counter, self._head)
        if row < len(counters) and all(col[row] == value for col, value in zip(self._cols, fields(entry), strict=True)):
            return row
        return -1

    def _entry(self, row: int) -> Entry:
        return Entry(*(col[row] for col in self._cols))


def fields(entry: Entry) -> tuple[int, int, int, int, int, int]:
    return (entry.counter, entry.created_ms, entry.size, entry.first_seq, entry.last_seq, entry.samples)


def entry_of(key: str) -> Entry:
    """The entry a queue key names (every field is in the key)."""
    entry = Entry.parse(key)
    if entry is None:
        raise ValueError(f"not a spool queue key: {key!r}")
    return entry
