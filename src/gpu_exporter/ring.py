"""A bounded ring of samples that readers follow by sequence number.

The sampler appends; the exposition reads the newest; the forwarder asks for everything after the last
sequence number it handled. When the ring is full the oldest sample is overwritten and counted, and a
reader that fell behind learns how many it missed.
"""

from __future__ import annotations

import threading
from collections import deque

from gpu_exporter.model import Sample

__all__ = ["RingBuffer"]


class RingBuffer:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"ring capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[Sample] = deque(maxlen=capacity)
        self._cond = threading.Condition()
        self.overwritten = 0

    def append(self, sample: Sample) -> None:
        with self._cond:
            if self._items and sample.seq <= self._items[-1].seq:
                raise ValueError(f"sequence must increase: {sample.seq} after {self._items[-1].seq}")
            if len(self._items) == self.capacity:
                self.overwritten += 1
            self._items.append(sample)
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def latest(self) -> Sample | None:
        with self._cond:
            return self._items[-1] if self._items else None

    def since(self, seq: int, limit: int | None = None) -> tuple[list[Sample], int]:
        """Samples with a sequence number above ``seq`` (oldest first), and how many were already gone."""
        with self._cond:
            items = list(self._items)
        if not items:
            return [], 0
        first = items[0].seq
        missed = max(0, first - seq - 1)
        start = max(0, seq - first + 1)
        out = items[start:] if limit is None else items[start : start + limit]
        return out, missed

    def wait_after(self, seq: int, timeout: float, interrupt: threading.Event | None = None) -> bool:
        """Block until a sample newer than ``seq`` exists, ``timeout`` passes or ``interrupt`` is set (and
        ``wake`` called); True if a newer sample exists."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    (bool(self._items) and self._items[-1].seq > seq) or (interrupt is not None and interrupt.is_set())
                ),
                timeout,
            )
            return bool(self._items) and self._items[-1].seq > seq

    def wake(self) -> None:
        """Have every ``wait_after`` look at its ``interrupt`` now."""
        with self._cond:
            self._cond.notify_all()
