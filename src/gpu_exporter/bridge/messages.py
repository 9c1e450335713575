"""What the bridge's MQTT thread hands the writer, and the decoding of it: a bad payload is counted and
logged (at most once a minute per reason), never raised."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpu_exporter import payload as codec
from gpu_exporter.bridge import summaries
from gpu_exporter.bridge.clock import Stamp
from gpu_exporter.bridge.limits import RateLog
from gpu_exporter.bridge.metrics import BridgeMetrics, Liveness, NodeNames
from gpu_exporter.payload import columns
from gpu_exporter.payload.columns import ColumnBatch

__all__ = ["MAX_NODES", "MessageHandler", "Received"]

log = logging.getLogger("gpu_exporter.bridge.service")

MAX_NODES = 100_000  # distinct node names kept in per-node metrics and logs


@dataclass(frozen=True, slots=True)
class Received:
    """A batch message as it came off the wire, waiting to be written and acknowledged."""

    mid: int
    qos: int
    topic: str
    payload: bytes
    stamp: Stamp | None = None  # when it arrived and, from MQTT 5 agents, when it was sent
    backlog: bool = False  # it came before the bridge first subscribed: it waited in the session


class MessageHandler:
    """Decodes one message; a bad payload is counted per node and reason and logged at most once a
    minute per reason, never raised."""

    def __init__(self, prefix: str, metrics: BridgeMetrics, max_payload: int, liveness: Liveness) -> None:
        self._prefix = prefix.rstrip("/") + "/"
        self._metrics = metrics
        self._max_payload = max_payload
        self._liveness = liveness
        self.nodes = NodeNames(MAX_NODES)
        self.log = RateLog(log)  # every kind of bad input: at most one line a minute

    def topic_node(self, topic: str) -> str:
        if topic.startswith(self._prefix):
            rest = topic[len(self._prefix) :]
            node, sep, _ = rest.rpartition("/")
            if sep and node:
                return node if len(node) <= codec.MAX_TEXT else "_invalid"  # no payload names such a node
        return "unknown"

    def decode(self, msg: Received) -> ColumnBatch | None:
        try:
            return self._decode(msg)
        except Exception as exc:  # the handler's promise: nothing escapes
            self.drop(self.topic_node(str(msg.topic)), "malformed", f"{type(exc).__name__}: {exc}")
            return None

    def _decode(self, msg: Received) -> ColumnBatch | None:
        node = self.topic_node(msg.topic)
        if len(msg.payload) > self._max_payload:
            self.drop(node, "oversized", f"payload of {len(msg.payload)} bytes exceeds {self._max_payload}")
            return None
        try:
            batch = columns.read(msg.payload, max_bytes=self._max_payload)
        except codec.PayloadError as exc:
            reason = "oversized" if "limit" in str(exc) else "malformed"
            self.drop(node, reason, str(exc))
            return None
        if batch.node != node:
            # The topic is what the broker's ACLs check: a node names itself only there.
            self.drop(node, "node_mismatch", f"payload names node {batch.node!r}, its topic {node!r}")
            return None
        self._liveness.seen(node)
        return summaries.complete(batch)  # a summary's gauges that held still: min = max = mean = last

    def drop(self, node: str, reason: str, why: str) -> None:
        """Count a dropped message for ``node`` (the node label values a misbehaving publisher can create
        are bounded); log it, at most once a minute per reason."""
        label = self.nodes.label(node)
        self._metrics.payloads_dropped.labels(label, reason).inc()
        self.log.warning(
            "drop:" + reason,
            "dropped a %s batch from node %s: %s (at most one line a minute per reason; see "
            "gpu_exporter_bridge_payloads_dropped_total)",
            reason,
            label,
            " ".join(why.split())[:300],
        )

    def status(self, topic: str, payload: bytes) -> None:
        """A retained status message: online or offline (plain text, or JSON with a "status" field)."""
        try:
            node = self.topic_node(topic)
            text = payload[:256].decode("utf-8", "replace").strip().lower()
            if not text:
                return
            if "offline" in text:
                self._liveness.status(node, False)
            elif "online" in text:
                self._liveness.status(node, True)
        except Exception:  # pragma: no cover - defensive, the network thread must go on
            log.debug("ignored a status message on %s", topic, exc_info=True)
