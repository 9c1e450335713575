"""Bounds no node name, and no number of node names, can get past: series per node, series in the whole
fleet, new node names per minute; and a log that says each kind of trouble at most once a minute.

Series are counted while they are active: a series counts from the first value the bridge writes for
it until it has had no value for one to two windows (``SERIES_WINDOW``, an hour), as a TSDB's head
forgets series that stopped. So pods that come and go, a node that leaves the fleet, or a flood that
stopped give their share of the budgets back. Each counted series costs a 64-bit hash in a node's sorted
array (8 bytes, where a set of Python ints took about 60: a 1,000-node fleet of 8-GPU nodes keeps about
7 MB instead of about 50). The converter asks only when a device's set of series changes, so a lookup
by bisection costs nothing that matters.

A new node name (one the bridge has no active series of) takes a token from a bucket that holds
``burst`` tokens and refills at ``per_minute`` tokens a minute, except the names the fleet introduces
right after the bridge starts: batches that waited in the bridge's session, and names with a retained
status message, which the broker sends on subscribing (``NewNodes``). A batch of a name without a token
waits for one (``admission.py``).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from array import array
from collections.abc import Callable

__all__ = ["INTRODUCTION", "QUIET", "SERIES_WINDOW", "NewNodes", "RateLog", "SeriesBudget"]

SERIES_WINDOW = 3600.0
INTRODUCTION = 300.0
QUIET = 10.0


class _Node:
    __slots__ = ("cur", "prev")

    def __init__(self) -> None:
        self.cur: array[int] = array("q")  # hashes of series with a value in the current window, sorted
        self.prev: array[int] = array("q")  # ... in the window before, not (yet) in this one


def _find(hashes: array[int], h: int) -> tuple[int, bool]:
    """Where ``h`` is, or would go, in the sorted ``hashes``, and whether it is there."""
    i = bisect.bisect_left(hashes, h)
    return i, i < len(hashes) and hashes[i] == h


class SeriesBudget:
    """Distinct active series per node and for the whole fleet. Not thread-safe (the writer's)."""

    def __init__(
        self, per_node: int, fleet: int, window: float = SERIES_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.per_node = per_node
        self.fleet = fleet
        self._window = window
        self._clock = clock
        self._nodes: dict[str, _Node] = {}
        self.total = 0
        self._turn = clock() + window
        self.refused = ""  # why the last refusal: "node" or "fleet"

    def knows(self, node: str) -> bool:
        return node in self._nodes

    def rotate_due(self) -> bool:
        """True when the window turned (the caller then forgets what it cached: each active series
        is admitted again, which moves it into the new window)."""
        now = self._clock()
        if now < self._turn:
            return False
        self._turn = now + self._window
        for name, node in list(self._nodes.items()):
            self.total -= len(node.prev)
            node.prev, node.cur = node.cur, array("q")
            if not node.prev:
                del self._nodes[name]
        return True

    def admit(self, node: str, entry: bytes) -> bool:
        """Whether ``node`` may write the series ``entry`` (its encoded labels)."""
        state = self._nodes.get(node)
        if state is None:
            state = self._nodes[node] = _Node()
        h = hash(entry)
        at, found = _find(state.cur, h)
        if found:
            return True
        was, found = _find(state.prev, h)
        if found:
            del state.prev[was]
            state.cur.insert(at, h)
            return True
        if len(state.cur) + len(state.prev) >= self.per_node:
            self.refused = "node"
            return False
        if self.total >= self.fleet:
            self.refused = "fleet"
            return False
        state.cur.insert(at, h)
        self.total += 1
        return True

    def nodes(self) -> int:
        return len(self._nodes)


class NewNodes:
    """Which new node names the bridge starts to write for. Thread-safe.

    Until the bridge first subscribed, every name is admitted: those batches waited in its session while
    it was away. Then the fleet introduces itself with its retained status messages, which the broker
    sends on subscribing: while they come (until none came for ``QUIET`` seconds, at most
    ``INTRODUCTION`` seconds after subscribing) a name with a status message is admitted. Any other new
    name takes a token from a bucket that holds ``burst`` (``per_minute`` when not given) and refills at
    ``per_minute`` a minute.
    """

    def __init__(
        self,
        per_minute: int,
        clock: Callable[[], float] = time.monotonic,
        max_names: int = 100_000,
        burst: int | None = None,
    ) -> None:
        self.per_minute = per_minute
        self.burst = max(1, burst or per_minute)
        self._clock = clock
        self._tokens = float(self.burst)
        self._at = clock()
        self._lock = threading.Lock()
        self._subscribed: float | None = None  # when the bridge first subscribed
        self._last_status: float | None = None
        self._introducing = True
        self._introduced: set[str] = set()
        self._max_names = max_names

    def subscribed(self) -> None:
        with self._lock:
            if self._subscribed is None:
                self._subscribed = self._clock()

    def has_subscribed(self) -> bool:
        with self._lock:
            return self._subscribed is not None

    def _still_introducing(self, now: float) -> bool:
        if self._introducing and self._subscribed is not None:
            quiet_since = max(self._subscribed, self._last_status or self._subscribed)
            if now - quiet_since >= QUIET or now - self._subscribed >= INTRODUCTION:
                self._introducing = False
                self._introduced.clear()  # admitted by now, or gone
        return self._introducing

    def status(self, node: str) -> None:
        """A status message of ``node``: during the introduction, its name is admitted."""
        with self._lock:
            now = self._clock()
            if (
                self._still_introducing(now)
                and self._subscribed is not None
                and len(self._introduced) < self._max_names
            ):
                self._introduced.add(node)
                self._last_status = now

    def take(self, node: str) -> bool:
        """A batch of ``node``, a name the bridge writes nothing for yet: True when it may be admitted."""
        with self._lock:
            now = self._clock()
            if self._subscribed is None:  # the session's backlog, in the writer before the subscription
                return True
            if self._still_introducing(now) and node in self._introduced:
                return True
            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_minute / 60.0)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


class RateLog:
    """At most one line per kind a minute; how many were held back is said in the next one."""

    def __init__(self, logger: logging.Logger, period: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self._log = logger
        self._period = period
        self._clock = clock
        self._next: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def warning(self, kind: str, message: str, *args: object) -> None:
        with self._lock:
            now = self._clock()
            if now < self._next.get(kind, now):
                self._held[kind] = self._held.get(kind, 0) + 1
                return
            self._next[kind] = now + self._period
            held = self._held.pop(kind, 0)
        if held:
            message += f" (and {held} more like it in the last minute)"
        self._log.warning(message, *args, stacklevel=2)
