"""Edge clocks: skew measured per batch, corrected or refused by policy, and never a sample in the future.

The agent stamps each PUBLISH with its clock (user property ``sent``) and a Message Expiry Interval
that the broker reduces by the seconds it held the message (mqtt/sendtime.py). On receipt::

    skew = sent - (received - held)

``received`` is the bridge's clock when paho handed over the message, ``held`` the broker's hold time
(whole seconds). What it cannot see is the time between the broker stamping the expiry (when it writes
the message out) and paho reading it: network transit, and above all a backlog. Mosquitto 2.0.11 writes
a connected subscriber its whole queue at once, far past the Receive Maximum, each message stamped as it
is written; while the bridge's in-flight bound holds paho's thread, they wait in the broker's output
buffer and the socket, minutes in a large backlog, with ``held`` 0. Such a wait only ever makes a node
look *behind*, never ahead: the true skew lies in ``[skew, skew + unseen]``, where ``unseen`` is what the
bridge's in-flight account says a message read now may have waited (bridge/inflight.py: the time since
the current backlog began, 0 outside one). The bridge takes the value of that interval closest to zero:
a clock counts as off only by what the wait cannot explain, so a backlog is never taken for a clock
behind, and a clock off by more than the backlog's age is still seen (and, backlog over, exactly).

Policy, per batch (docs/bridge.md):

* ``|skew| <= max_skew``: timestamps stay as the node wrote them; except that a node *ahead* whose batch
  holds samples after the bridge's clock is corrected like a large skew (else its newest samples, all
  of them for a node a few minutes ahead, would be refused below).
* ``|skew| > max_skew``: policy ``correct`` moves every timestamp of the batch back by the skew, rounded
  up to whole seconds (so a corrected sample is never later than an exact correction would put it);
  policy ``refuse`` refuses the whole batch. Both are counted per node.
* Then, whatever happened above and whether or not the batch had a send time (MQTT 3.1.1 agents have
  none): a sample stamped after the bridge's clock, or before 1970, is refused and counted. Nothing is
  ever written in the bridge's future, so one node cannot push the TSDB's head forward and make
  everyone else's samples "too old".
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpu_exporter.bridge.metrics import BridgeMetrics, NodeNames
from gpu_exporter.mqtt import sendtime
from gpu_exporter.payload.columns import ColumnBatch

__all__ = ["POLICIES", "ClockGuard", "Stamp", "stamp_of"]

POLICIES = ("correct", "refuse")
_MAX_MS = (1 << 53) - 1  # the payload's own bound on timestamps


@dataclass(frozen=True, slots=True)
class Stamp:
    """When a batch arrived, and what its PUBLISH said about when it was sent."""

    received_ms: int
    sent_ms: int | None = None
    held_ms: int = 0
    unseen_ms: int = 0  # how long it may have waited, after the broker stamped it, before paho read it

    @property
    def skew_ms(self) -> int | None:
        """The node's clock minus the bridge's at the time of sending, as measured; None without a send
        time. A wait the bridge cannot see (``unseen_ms``) makes it that much too low."""
        if self.sent_ms is None:
            return None
        return self.sent_ms - (self.received_ms - self.held_ms)

    @property
    def estimate_ms(self) -> int | None:
        """The skew closest to zero that the measurement allows: in ``[skew_ms, skew_ms + unseen_ms]``."""
        skew = self.skew_ms
        if skew is None or skew >= 0:
            return skew
        return min(skew + max(self.unseen_ms, 0), 0)


def stamp_of(properties: Any, received: float | None = None, unseen: float = 0.0) -> Stamp:
    """The stamp of a message from its MQTT 5 properties (None or missing fields: no send time);
    ``unseen``: the seconds it may have waited unseen before it was read (Inflight.unseen)."""
    received_ms = time.time_ns() // 1_000_000 if received is None else round(received * 1000)
    sent_ms: int | None = None
    held_ms = 0
    for name, value in getattr(properties, "UserProperty", None) or ():
        if name == sendtime.SENT:
            try:
                sent = int(value)
            except (TypeError, ValueError):
                break
            if 0 <= sent <= _MAX_MS:  # anything else is no usable send time
                sent_ms = sent
            break
    remaining = getattr(properties, "MessageExpiryInterval", None)
    if sent_ms is not None and isinstance(remaining, int) and 0 <= remaining <= sendtime.EXPIRY_S:
        held_ms = (sendtime.EXPIRY_S - remaining) * 1000
    return Stamp(received_ms, sent_ms, held_ms, math.ceil(unseen * 1000))


class ClockGuard(Collector):
    """Applies the policy above and exports ``gpu_exporter_node_clock_skew_seconds{node}``."""

    def __init__(self, max_skew: float, policy: str, metrics: BridgeMetrics, nodes: NodeNames | None = None) -> None:
        if policy not in POLICIES:
            raise ValueError(f"invalid clock-skew policy {policy!r} (use {' or '.join(POLICIES)})")
        self.max_skew_ms = round(max_skew * 1000)
        self.policy = policy
        self._metrics = metrics
        self._nodes = nodes or NodeNames()
        self._skew: dict[str, float] = {}
        self._lock = threading.Lock()

    def skew(self, node: str) -> float | None:
        with self._lock:
            return self._skew.get(node)

    def check(
        self, batch: ColumnBatch, stamp: Stamp, keep: list[int] | None, now_ms: int
    ) -> tuple[ColumnBatch, list[int] | None] | None:
        """The batch to write (its timestamps corrected where the policy says so) and the positions of
        ``keep`` (None: all) that may be written; None when nothing may."""
        node = self._nodes.label(batch.node)
        times = batch.times_ms
        positions = range(len(times)) if keep is None else keep
        skew = stamp.estimate_ms
        if skew is not None:
            with self._lock:
                self._skew[node] = skew / 1000
            beyond = abs(skew) > self.max_skew_ms
            into_future = skew > 0 and any(times[i] > now_ms for i in positions)
            if beyond and self.policy == "refuse":
                self._metrics.edge_refused.labels(node, "clock_skew").inc(len(positions))
                return None
            if self.policy == "correct" and (beyond or into_future):
                offset = math.ceil(skew / 1000) * 1000
                times = [t - offset for t in times]
                batch = dataclasses.replace(batch, times_ms=times)
                self._metrics.edge_corrected.labels(node).inc(len(positions))
        future = [i for i in positions if times[i] > now_ms]
        early = [i for i in positions if times[i] < 0]
        if not future and not early:
            return batch, keep
        if future:
            self._metrics.edge_refused.labels(node, "future").inc(len(future))
        if early:
            self._metrics.edge_refused.labels(node, "before_epoch").inc(len(early))
        kept = [i for i in positions if 0 <= times[i] <= now_ms]
        return (batch, kept) if kept else None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            skews = dict(self._skew)
        family = GaugeMetricFamily(
            "gpu_exporter_node_clock_skew_seconds",
            "The node's clock minus the bridge's, measured on the last batch that carried a send time "
            "(MQTT 5 agents), less any wait of that batch the bridge cannot rule out (a backlog); "
            "positive: the node is ahead.",
            labels=["node"],
        )
        for node in sorted(skews):
            family.add_metric([node], skews[node])
        yield family
