"""Twin agents: two agents publishing under one node name at the same time (a copied config, a cloned
VM, a pod and a systemd unit on the same node).

Each agent process has its own boot id. One node's boots normally follow each other: an agent stops
before the next one starts, so a boot's samples all come before the next boot's, even when the old
boot's spooled backlog is sent after the new boot's first batches. Two live agents instead write the
same stretch of time under two boots. So the bridge remembers, per node, the time span of the samples of
its last few boots, and a batch whose span overlaps that of another boot heard from in the last
``LIVE`` seconds is a twin's: counted per node
(``gpu_exporter_bridge_twin_batches_total{node}``, alert ``GPUEdgeTwinAgents``), and said in the log
once a minute. The batch is still written: both agents report real GPUs, and the samples differ.

A node's clock stepped back by more than a batch across an agent restart looks the same; that too is
worth a look.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["LIVE", "Twins"]

LIVE = 600.0  # seconds: a boot heard from this recently is live
_BOOTS = 4  # boots remembered per node


class Twins:
    """Boot spans per node; bounded in nodes (oldest first) and boots per node. Not thread-safe."""

    def __init__(self, max_nodes: int = 100_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_nodes = max_nodes
        self._clock = clock
        # node -> boot -> [first sample ms, last sample ms, heard at (clock)]
        self._nodes: OrderedDict[str, dict[str, list[float]]] = OrderedDict()

    def seen(self, node: str, boot: str, first_ms: int, last_ms: int) -> str | None:
        """Record a batch of ``boot`` spanning ``first_ms``..``last_ms``; the other live boot it
        overlaps, if any (a twin)."""
        now = self._clock()
        boots = self._nodes.get(node)
        if boots is None:
            if len(self._nodes) >= self._max_nodes:
                self._nodes.popitem(last=False)
            boots = self._nodes[node] = {}
        else:
            self._nodes.move_to_end(node)
        twin = None
        for other, (first, last, heard) in boots.items():
            if other != boot and now - heard <= LIVE and first_ms <= last and first <= last_ms:
                twin = other
                break
        span = boots.get(boot)
        if span is None:
            if len(boots) >= _BOOTS:
                del boots[min(boots, key=lambda b: boots[b][2])]
            boots[boot] = [first_ms, last_ms, now]
        else:
            span[0], span[1], span[2] = min(span[0], first_ms), max(span[1], last_ms), now
        return twin
