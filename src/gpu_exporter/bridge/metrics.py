"""The bridge's own metrics: throughput, lag, write errors, drops, and node liveness."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpu_exporter.selfmetrics import Declare

__all__ = ["BridgeMetrics", "Liveness", "NodeNames"]


class NodeNames:
    """Bounds the node label values a misbehaving publisher can create: past ``limit`` distinct
    nodes, the rest are counted under ``_other``. Thread-safe."""

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._known: set[str] = set()
        self._lock = threading.Lock()

    def label(self, node: str) -> str:
        with self._lock:
            if node in self._known:
                return node
            if len(self._known) >= self._limit:
                return "_other"
            self._known.add(node)
            return node


class BridgeMetrics:
    """Every ``gpu_exporter_bridge_*`` counter and gauge, registered in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        m = Declare(registry, "gpu_exporter_bridge_")
        self.messages = m.counter("messages_received", "MQTT batch messages received.")
        self.payloads_dropped = m.counter(
            "payloads_dropped",
            "Batch messages acknowledged and dropped because they could not be "
            "used, by node (from the topic) and reason (malformed, oversized, node_mismatch: the payload "
            "names another node than its topic).",
            ["node", "reason"],
        )
        self.gpu_samples = m.counter(
            "gpu_samples_written", "Per-device samples (one GPU at one time) written to remote storage."
        )
        self.samples = m.counter(
            "samples_written", "Remote-write samples (one value of one series) accepted by remote storage."
        )
        self.samples_rejected = m.counter(
            "samples_rejected",
            "Samples remote storage refused for good and that were dropped, by reason (too_old, "
            "out_of_order, duplicate, client_error: any other 4xx, a 3xx redirect included).",
            ["reason"],
        )
        self.duplicates = m.counter(
            "duplicate_samples", "Edge samples dropped because the same (node, boot, seq) was written before."
        )
        self.requests = m.counter("write_requests", "Remote-write requests by HTTP status (0: no answer).", ["code"])
        self.write_errors = m.counter(
            "write_errors",
            "Remote-write attempts that failed and were retried, by reason (network, server, throttled).",
            ["reason"],
        )
        self.write_duration = m.histogram(
            "write_duration_seconds",
            "Time of one remote-write HTTP request.",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.lag = m.gauge(
            "lag_seconds",
            "Age of the newest sample in the last write that remote storage accepted, when it was written.",
        )
        self.last_write = m.gauge(
            "last_write_timestamp_seconds",
            "When the last remote write that remote storage accepted (any of its samples) finished.",
        )
        self.queue = m.gauge("queue_messages", "Messages received and not yet written and acknowledged.")
        self.connected = m.gauge(
            "mqtt_connected", "1 while connected to the MQTT broker and subscribed to the batch topic (receiving)."
        )
        self.edge_refused = m.counter(
            "edge_samples_refused",
            "Edge samples (one timestamp of a batch) the bridge refused before writing, by node and reason "
            "(clock_skew: the node's clock is off and the policy is refuse; future: stamped after the "
            "bridge's clock; before_epoch: stamped before 1970).",
            ["node", "reason"],
        )
        self.edge_corrected = m.counter(
            "edge_samples_corrected",
            "Edge samples whose timestamps were moved by the node's measured clock skew, by node.",
            ["node"],
        )
        self.series_limited = m.counter(
            "series_limited",
            "Values dropped because a series limit refused their series, by node and reason (node: the node "
            "reached --bridge.max-series-per-node; fleet: the fleet reached --bridge.max-series).",
            ["node", "reason"],
        )
        self.values_dropped = m.counter(
            "values_dropped",
            "Values dropped by the value policy, by node and reason (nan, inf, negative_counter, counter_backwards).",
            ["node", "reason"],
        )
        self.labels_dropped = m.counter(
            "labels_dropped",
            "Identity strings left out of gpu_info, by node and reason (invalid_name, name_too_long, "
            "reserved, value_too_long, too_many); counted once per distinct set of identity strings.",
            ["node", "reason"],
        )
        self.new_nodes = m.counter("new_nodes", "Node names the bridge started to write series for.")
        self.new_nodes_refused = m.counter(
            "new_nodes_refused",
            "Batches of new node names dropped because the waiting room for admission was full (half of "
            "--bridge.max-inflight or --bridge.max-inflight-bytes).",
        )
        self.held_back = m.counter(
            "held_back",
            "Batches of new node names held back, unacknowledged, until their name is admitted "
            "(--bridge.new-nodes-burst, --bridge.new-nodes-per-minute).",
        )
        self.held_back_messages = m.gauge("held_back_messages", "Batches of new node names waiting for admission.")
        self.held_back_bytes = m.gauge("held_back_bytes", "Payload bytes of the batches waiting for admission.")
        self.held_back_nodes = m.gauge("held_back_nodes", "New node names whose batches wait for admission.")
        self.held_back_oldest = m.gauge(
            "held_back_oldest_seconds", "How long the oldest batch waiting for admission has waited (0: none waits)."
        )
        self.active_series = m.gauge(
            "active_series", "Series counted against --bridge.max-series (active in the last 1-2 hours)."
        )
        self.twin_batches = m.counter(
            "twin_batches",
            "Batches whose samples overlap in time those of another live boot of the same node: two agents "
            "publish under one node name. By node.",
            ["node"],
        )
        self.queue_bytes = m.gauge("queue_bytes", "Payload bytes received and not yet written and acknowledged.")
        self.inflight_wait = m.counter(
            "inflight_wait_seconds",
            "Time the MQTT network thread waited because --bridge.max-inflight or --bridge.max-inflight-bytes "
            "was reached (meanwhile the broker keeps the messages).",
        )
        self.takeovers = m.counter(
            "session_takeovers",
            "Connections the broker closed because another client connected with the bridge's client id, by "
            "evidence: reason (MQTT 5 Session taken over), pattern (closed soon after connecting, again and "
            "again, without a reason).",
            ["evidence"],
            known=("reason", "pattern"),
        )
        self.redeliveries = m.counter(
            "redeliveries_skipped",
            "Messages the broker sent again (after a reconnection) while the bridge still held them.",
        )

    def watch_admission(self, usage: Callable[[], tuple[int, int, int]], oldest: Callable[[], float]) -> None:
        """The held-back gauges, read from the admission's (names, messages, bytes) and oldest wait."""
        self.held_back_nodes.set_function(lambda: usage()[0])
        self.held_back_messages.set_function(lambda: usage()[1])
        self.held_back_bytes.set_function(lambda: usage()[2])
        self.held_back_oldest.set_function(oldest)


class Liveness(Collector):
    """Node liveness from the retained status topic, as ``gpu_exporter_node_up`` and last-seen time.

    Built fresh from a snapshot at each collect, so a node needs no gauge child to be removed.
    """

    def __init__(self, max_nodes: int = 100_000) -> None:
        self._lock = threading.Lock()
        self._up: dict[str, bool] = {}
        self._seen: dict[str, float] = {}
        self._max_nodes = max_nodes  # a bound on series a misbehaving publisher could create

    def status(self, node: str, online: bool, when: float | None = None) -> None:
        with self._lock:
            if node in self._seen or len(self._seen) < self._max_nodes:
                self._up[node] = online
                self._seen[node] = time.time() if when is None else when

    def seen(self, node: str, when: float | None = None) -> None:
        with self._lock:
            if node in self._seen or len(self._seen) < self._max_nodes:
                self._seen[node] = time.time() if when is None else when
                self._up.setdefault(node, True)

    def snapshot(self) -> tuple[dict[str, bool], dict[str, float]]:
        with self._lock:
            return dict(self._up), dict(self._seen)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up, seen = self.snapshot()
        g_up = GaugeMetricFamily(
            "gpu_exporter_node_up",
            "1 when the node's exporter says it is online (retained status topic).",
            labels=["node"],
        )
        g_seen = GaugeMetricFamily(
            "gpu_exporter_node_last_seen_timestamp_seconds",
            "When the bridge last heard from the node (status or batch).",
            labels=["node"],
        )
        for node in sorted(up):
            g_up.add_metric([node], 1.0 if up[node] else 0.0)
        for node in sorted(seen):
            g_seen.add_metric([node], seen[node])
        yield g_up
        yield g_seen
