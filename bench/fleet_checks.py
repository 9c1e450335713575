"""What the fleet bench reads back from the TSDB: the publish-to-queryable lag of probe nodes, and the
count check (every sample the broker acknowledged, stored once)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import fleet_procs as procs
from fleet_nodes import Acked, Fleet, Node
from fleet_shards import Sharded

__all__ = ["Prober", "count_check"]


class Prober:
    """Publish-to-queryable lag of the batches of a few probe nodes: after the broker's PUBACK, their
    newest sample is looked for in VictoriaMetrics (raw export, every 0.25 s) until it is there."""

    def __init__(self, vm: procs.Victoria | Sharded, probe_nodes: set[int]) -> None:
        self.vm = vm
        self.nodes = probe_nodes
        self.outstanding: list[tuple[str, int, float]] = []  # (node, newest sample ms, sent)
        self.lags: list[tuple[float, float]] = []  # (sent, lag)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self._thread.start()

    def acked(self, node: Node, record: Acked) -> None:
        if node.index in self.nodes:
            with self._lock:
                self.outstanding.append((node.name, record.message.times_ms[-1], record.sent))

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                todo = list(self.outstanding)
            if not todo:
                continue
            names = "|".join(sorted({n for n, _, _ in todo}))
            try:
                seen = {
                    (labels.get("node", ""), ts)
                    for labels, stamps in self.vm.export(
                        f'gpu_up{{gpu="0",node=~"{names}"}}', min(t for _, t, _ in todo) - 1
                    )
                    for ts in stamps
                }
            except OSError:
                continue
            now = time.time()
            done = [p for p in todo if (p[0], p[1]) in seen]
            with self._lock:
                for p in done:
                    self.outstanding.remove(p)
                    self.lags.append((p[2], now - p[2]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def count_check(vm: procs.Victoria | Sharded, fleet: Fleet) -> tuple[int, int, int, int]:
    """(samples lost, samples duplicated, nodes with a loss, nodes with a duplicate): per node, the
    timestamps of gpu_up{gpu="0"} in the TSDB against every batch the broker acknowledged."""
    expected: dict[str, list[int]] = {}
    for n in fleet.nodes:
        expected[n.name] = [t for a in n.acked for t in a.message.times_ms]
    start = min((min(v) for v in expected.values() if v), default=0) - 1000
    stored: dict[str, Counter[int]] = {}
    for labels, stamps in vm.export('gpu_up{gpu="0"}', start):
        stored.setdefault(labels.get("node", ""), Counter()).update(stamps)
    lost = dup = nodes_lost = nodes_dup = 0
    for name, times in expected.items():
        have = stored.get(name, Counter())
        want = Counter(times)
        node_lost = sum(max(0, n - have[t]) for t, n in want.items())
        node_dup = sum(max(0, n - want[t]) for t, n in have.items())
        lost += node_lost
        dup += node_dup
        nodes_lost += node_lost > 0
        nodes_dup += node_dup > 0
    return lost, dup, nodes_lost, nodes_dup
