"""Which batches of new node names the bridge writes now, and which wait: admission without loss.

A node name the bridge writes nothing for yet takes a token from ``NewNodes`` (``limits.py``): a bucket of
``--bridge.new-nodes-burst`` names (by default sized to ``--bridge.max-series``, so the fleet the series
budget was sized for is admitted at once, a DaemonSet rollout included) that refills at
``--bridge.new-nodes-per-minute``. A batch of a name without a token is *held back*: it is not
acknowledged, so the broker still owes it to nobody else, and it waits here until its name gets a token,
then it is written like any other. A name's later batches wait behind its first.

What waits is part of the bridge's in-flight account (``inflight.py``: its messages were received and are
not yet acknowledged), and may take at most half of it, in messages and in bytes, so that admitted nodes
keep flowing through the other half whatever waits. A batch that finds the waiting room full is dropped
and counted (``gpu_exporter_bridge_new_nodes_refused_total``): past the burst and the waiting room, a flood
of invented names is what this bounds. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from gpu_exporter.bridge.limits import NewNodes
from gpu_exporter.bridge.messages import Received

__all__ = ["HOLD", "REFUSE", "WRITE", "Admission"]

WRITE, HOLD, REFUSE = "write", "hold", "refuse"


class Admission:
    """The new-name bucket and the waiting room of batches held back until their name is admitted."""

    def __init__(
        self, new_nodes: NewNodes, max_messages: int, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.new_nodes = new_nodes
        self.max_messages = max(1, max_messages)
        self.max_bytes = max(1, max_bytes)
        self._clock = clock
        self._lock = threading.Lock()
        # name -> its waiting messages with when each arrived, names in the order they first waited
        self._waiting: OrderedDict[str, list[tuple[Received, float]]] = OrderedDict()
        self._ids: set[int] = set()  # id() of every waiting message
        self._count = 0
        self._bytes = 0
        self._granted: set[str] = set()  # names that got a token, until the bridge knows them
        self.held = 0  # messages held back, ever
        self.waited = 0.0  # seconds admitted messages spent waiting, in all

    def check(self, node: str, msg: Received, known: bool) -> str:
        """WRITE, HOLD (``msg`` now waits, unacknowledged) or REFUSE (the waiting room is full) for a batch
        of ``node``; ``known``: the bridge writes for ``node`` already (or admitted it in this write)."""
        with self._lock:
            if id(msg) in self._ids:  # waits already (a write retried message by message)
                return HOLD
            if known:
                self._granted.discard(node)
                return WRITE
            if node in self._granted:
                return WRITE
            if node not in self._waiting and (msg.backlog or self.new_nodes.take(node)):
                self._granted.add(node)
                return WRITE
            size = len(msg.payload)
            if self._count >= self.max_messages or (self._count and self._bytes + size > self.max_bytes):
                return REFUSE
            self._waiting.setdefault(node, []).append((msg, self._clock()))
            self._ids.add(id(msg))
            self._count += 1
            self._bytes += size
            self.held += 1
            return HOLD

    def holds(self, msg: Received) -> bool:
        """Whether ``msg`` waits (then it is neither acknowledged nor released)."""
        with self._lock:
            return id(msg) in self._ids

    def due(self) -> list[Received]:
        """The waiting messages of the names that get a token now, oldest name first; they leave the
        waiting room (``check`` says WRITE for them, and for their names' later batches)."""
        out: list[Received] = []
        now = self._clock()
        with self._lock:
            while self._waiting:
                node = next(iter(self._waiting))
                if not self.new_nodes.take(node):
                    break
                self._granted.add(node)
                for msg, since in self._waiting.pop(node):
                    self._ids.discard(id(msg))
                    self._count -= 1
                    self._bytes -= len(msg.payload)
                    self.waited += now - since
                    out.append(msg)
        return out

    def usage(self) -> tuple[int, int, int]:
        """(names, messages, bytes) waiting now."""
        with self._lock:
            return len(self._waiting), self._count, self._bytes

    def oldest_wait(self) -> float:
        """Seconds the oldest waiting message has waited (0 when none waits)."""
        with self._lock:
            if not self._waiting:
                return 0.0
            return self._clock() - min(since for msgs in self._waiting.values() for _, since in msgs[:1])
