"""Twin agents: two agents connected with one client id (one node name, two boots live).

The broker lets one client id hold one connection: each time one twin connects, the broker closes the
other's, which reconnects and closes the first, several times a minute. Nothing is lost (batches wait in
each spool and are resent), but both links flap and the node's data arrive from two boots at once. The
agent tells it from what the broker says when it closes the connection:

- MQTT 5 brokers that send DISCONNECT with reason 0x8E, Session taken over (HiveMQ, EMQX, VerneMQ...):
  another client connected with this client id. Certain.
- Brokers that just close the socket (MQTT 3.1.1 has no reason to give; Mosquitto 2.0 closes the old
  connection without a DISCONNECT on MQTT 5 too): a pattern. ``STREAK`` connections in a row that the
  broker accepted and then closed without a reason within ``EARLY`` seconds (or twice
  ``--mqtt.reconnect-max-delay``: a twin's connection lasts until the other reconnects), and no failed
  connection attempt between them, within ``WINDOW`` seconds: likely a twin (a flapping network usually
  fails some attempts too, and ends connections by timeouts, which do not count).

Each is one warning line (at most one per ``_LOG_EVERY`` seconds) that names the client id and node, and
counts in ``gpu_exporter_forward_session_takeovers_total{evidence}``; ``gpu_exporter_forward_twin_suspected``
is 1 while the last such loss is less than ``WINDOW`` old.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["TwinWatch"]

log = logging.getLogger("gpu_exporter.forward")

SESSION_TAKEN_OVER = 0x8E
_UNSPECIFIED = 0x80  # what paho reports for a connection the peer closed without a reason
EARLY = 60.0  # seconds: a connection closed sooner than this after CONNACK counts towards the pattern
STREAK = 3
WINDOW = 300.0
_LOG_EVERY = 600.0

# (reason code or None, whether a DISCONNECT packet from the broker gave it, seconds since CONNACK)
Loss = tuple[int | None, bool, float]


class TwinWatch:
    def __init__(
        self,
        registry: CollectorRegistry,
        node: str,
        client_id: str,
        reconnect_max_delay: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.client_id = client_id
        self.early = EARLY
        self.reconfigure(reconnect_max_delay)
        self._clock = clock
        self._early: deque[float] = deque(maxlen=STREAK)  # when each early loss of the streak happened
        self._last = -math.inf  # the last loss counted as a takeover
        self._logged = -math.inf
        self.takeovers = Counter(
            "gpu_exporter_forward_session_takeovers",
            "Broker connections ended by another client with this agent's client id (a twin agent): reason "
            "(the broker said Session taken over, MQTT 5), pattern (closed soon after connecting, again and "
            "again, without a reason).",
            ["evidence"],
            registry=registry,
        )
        for evidence in ("reason", "pattern"):
            self.takeovers.labels(evidence)
        self.suspected = Gauge(
            "gpu_exporter_forward_twin_suspected",
            "1 while another client with this agent's client id keeps taking its broker connection over.",
            registry=registry,
        )
        self.suspected.set_function(lambda: 1.0 if self._clock() - self._last < WINDOW else 0.0)

    def reconfigure(self, reconnect_max_delay: float) -> None:
        """A reloaded ``--mqtt.reconnect-max-delay``: a twin's connection lasts until the other reconnects,
        at most its reconnect delay."""
        self.early = max(EARLY, 2 * reconnect_max_delay)

    def down(self, loss: Loss | None) -> None:
        """The link went down: ``loss`` says how a connection ended, None when an attempt failed."""
        now = self._clock()
        if loss is None:
            self._early.clear()  # the broker was not reachable or refused: not a twin's doing
            return
        code, from_broker, seconds = loss
        if code == SESSION_TAKEN_OVER:
            self._count("reason", now, "the broker says: Session taken over")
            return
        if from_broker or code not in (None, _UNSPECIFIED) or seconds >= self.early:
            self._early.clear()
            return
        self._early.append(now)
        if len(self._early) == STREAK and now - self._early[0] <= WINDOW:
            self._count(
                "pattern",
                now,
                f"the broker closed {STREAK} connections in a row within {self.early:.0f} s of accepting them, "
                "without a reason (MQTT 3.1.1, or a broker that sends none)",
            )

    def _count(self, evidence: str, now: float, why: str) -> None:
        self.takeovers.labels(evidence).inc()
        self._last = now
        if now - self._logged >= _LOG_EVERY:
            self._logged = now
            log.warning(
                "another MQTT client is using this agent's client id %r (%s): likely a second agent with "
                "--node-name=%s (or the same --mqtt.client-id) running elsewhere; each takes the other's "
                "connection, so both links flap and the node's samples come from two boots. Stop one, or "
                "give each its own node name (gpu_exporter_forward_session_takeovers_total)",
                self.client_id,
                why,
                self.node,
            )
