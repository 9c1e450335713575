"""Replay detection by (node, boot, seq), in bounded memory.

Sequence numbers of one agent boot increase by one per sample, so what was written is kept as a few
disjoint closed ranges per (node, boot) rather than as single numbers. A replayed batch (a publish the
broker delivered twice, a spool resent after a lost PUBACK) falls inside a range and is skipped.

Memory is bounded twice: at most ``max_ranges`` ranges per (node, boot) (the oldest ranges go first,
which only means a very old replay would be written again, and writing the same value at the same
timestamp again is harmless), and at most ``max_streams`` (node, boot) pairs, least recently used first.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence

__all__ = ["SeqTracker"]


class _Ranges:
    __slots__ = ("his", "los")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []

    def contains(self, seq: int) -> bool:
        i = bisect.bisect_right(self.los, seq) - 1
        return i >= 0 and seq <= self.his[i]

    def add(self, lo: int, hi: int) -> None:
        """Add [lo, hi], merging with ranges it overlaps or touches."""
        i = bisect.bisect_left(self.his, lo - 1)  # first range that could touch
        j = i
        while j < len(self.los) and self.los[j] <= hi + 1:
            lo = min(lo, self.los[j])
            hi = max(hi, self.his[j])
            j += 1
        self.los[i:j] = [lo]
        self.his[i:j] = [hi]

    def trim(self, max_ranges: int) -> None:
        if len(self.los) > max_ranges:
            del self.los[: len(self.los) - max_ranges]
            del self.his[: len(self.his) - max_ranges]


class SeqTracker:
    """Which (node, boot, seq) were written. Thread-safe."""

    def __init__(self, max_streams: int = 100_000, max_ranges: int = 64) -> None:
        if max_streams < 1 or max_ranges < 1:
            raise ValueError("max_streams and max_ranges must be at least 1")
        self._max_streams = max_streams
        self._max_ranges = max_ranges
        self._streams: OrderedDict[tuple[str, str], _Ranges] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._streams)

    def seen(self, node: str, boot: str, seq: int) -> bool:
        with self._lock:
            ranges = self._streams.get((node, boot))
            return ranges is not None and ranges.contains(seq)

    def unseen(self, node: str, boot: str, seqs: Sequence[int]) -> list[int]:
        """Positions in ``seqs`` of the sequence numbers not written yet."""
        with self._lock:
            ranges = self._streams.get((node, boot))
            if ranges is None:
                return list(range(len(seqs)))
            return [i for i, s in enumerate(seqs) if not ranges.contains(s)]

    def mark(self, node: str, boot: str, seqs: Iterable[int]) -> None:
        """Record ``seqs`` (ascending) as written."""
        with self._lock:
            key = (node, boot)
            ranges = self._streams.get(key)
            if ranges is None:
                ranges = self._streams[key] = _Ranges()
                while len(self._streams) > self._max_streams:
                    self._streams.popitem(last=False)
            else:
                self._streams.move_to_end(key)
            run_lo = run_hi = None
            for s in seqs:
                if run_hi is not None and s == run_hi + 1:
                    run_hi = s
                    continue
                if run_lo is not None and run_hi is not None:
                    ranges.add(run_lo, run_hi)
                run_lo = run_hi = s
            if run_lo is not None and run_hi is not None:
                ranges.add(run_lo, run_hi)
            ranges.trim(self._max_ranges)

    def ranges(self, node: str, boot: str) -> list[tuple[int, int]]:
        with self._lock:
            r = self._streams.get((node, boot))
            return [] if r is None else list(zip(r.los, r.his, strict=True))
