"""The bridge's MQTT session as /readyz and the log tell it: since when it is down, why, and whether
another client took it over.

Readiness: the bridge is ready once it has subscribed, and stays so while it is connected or was
disconnected for less than ``--bridge.readiness-timeout`` (a broker restart or a reconnection is not an
outage), and while remote writes have not been failing for that long (``RemoteWriter.failing_since``).

A broker keeps one connection per client id: when another client connects with the bridge's, the
broker closes the bridge's connection, the bridge reconnects and closes the other's, and so on. The
bridge tells it from what the broker says, as the agent does (``forward/twins.py``):

- a DISCONNECT with reason 0x8E, Session taken over (MQTT 5 brokers such as HiveMQ, EMQX, VerneMQ, and
  Mosquitto from 2.0.15): certain;
- connections closed without a DISCONNECT (Mosquitto before 2.0.15 just closes the socket) ``STREAK``
  times in a row, each within ``EARLY`` seconds of its CONNACK, with no failed connection attempt
  between them: likely (a network that drops connections usually fails some attempts too).

Each is counted in ``gpu_exporter_bridge_session_takeovers_total{evidence}`` and logged (at most a line
a minute) with the client id. A CONNACK that refuses the connection stays the reason /readyz gives (the
disconnect paho reports after it is not another one); a broker without MQTT 5, which the bridge cannot
work with, is named as such. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import Counter

from gpu_exporter.bridge.limits import RateLog

__all__ = ["EARLY", "SESSION_TAKEN_OVER", "STREAK", "UNSUPPORTED_PROTOCOL", "Session"]

SESSION_TAKEN_OVER = 0x8E
UNSUPPORTED_PROTOCOL = 0x84  # the CONNACK of a broker without MQTT 5 (3.1.1's return code 1, as paho reads it)
_UNSPECIFIED = 0x80  # what paho reports for a connection the peer closed without a reason
EARLY = 30.0  # seconds: a connection closed sooner than this after its CONNACK counts towards the pattern
STREAK = 3


class Session:
    """Connection state of one bridge's MQTT client (paho's thread writes, /readyz reads)."""

    def __init__(
        self,
        where: str,
        client_id: str,
        takeovers: Counter,
        ratelog: RateLog,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = where
        self.client_id = client_id
        self._takeovers = takeovers
        self._log = ratelog
        self._clock = clock
        self._lock = threading.Lock()
        self._subscribed_once = False
        self._down_since: float | None = clock()
        self._why = "not connected yet"
        self._connack: float | None = None
        self._early = 0  # connections in a row closed without a reason soon after their CONNACK

    def connected(self) -> None:
        with self._lock:
            self._connack = self._clock()

    def subscribed(self) -> None:
        with self._lock:
            self._subscribed_once = True
            self._down_since = None

    def failed(self, why: str) -> None:
        """A connection attempt failed (refused, unreachable): not a takeover."""
        with self._lock:
            self._early = 0
            self._why = why
            if self._down_since is None:
                self._down_since = self._clock()

    def refused(self, code: int, reason: str) -> bool:
        """The broker's CONNACK refused the connection: True when that was said here (a broker without
        MQTT 5, which the bridge cannot work with: one line a minute, and /readyz says it)."""
        if code != UNSUPPORTED_PROTOCOL:
            self.failed(f"refused: {reason}")
            return False
        self.failed("refused: the broker does not speak MQTT 5 (Unsupported protocol version)")
        self._log.warning(
            "mqtt5",
            "MQTT broker %s does not speak MQTT 5: it refused the connection with Unsupported protocol version, "
            "as an MQTT 3.1.1-only broker does. The bridge needs MQTT 5 (session expiry, Receive Maximum, "
            "Maximum Packet Size; shared subscriptions for --bridge.group): point --mqtt.url at an MQTT 5 "
            'broker (docs/bridge.md, "Brokers"); retrying',
            self.where,
        )
        return True

    def lost(self, code: int | None, from_broker: bool, reason: str) -> bool:
        """The connection closed with ``code`` (a DISCONNECT from the broker when ``from_broker``): True
        when that was said already (a takeover, then counted and logged; the end of a refused one)."""
        with self._lock:
            if self._connack is None and self._why.startswith("refused:"):
                return True  # paho's disconnect after a refusing CONNACK: the refusal is the reason
        evidence = self._loss(code, from_broker, reason)
        if evidence is None:
            return False
        self._takeovers.labels(evidence).inc()
        self._log.warning(
            "takeover",
            "MQTT session taken over: another client connected with this bridge's client id %r (%s): a second "
            "bridge with the same --bridge.client-id? The two knock each other off until one stops; give "
            "each its own (see gpu_exporter_bridge_session_takeovers_total)",
            self.client_id,
            "the broker says: Session taken over"
            if evidence == "reason"
            else f"the broker closed {STREAK} connections in a row soon after accepting them, without a reason",
        )
        return True

    def _loss(self, code: int | None, from_broker: bool, reason: str) -> str | None:
        """The takeover's evidence ("reason" or "pattern") of a lost connection, or None."""
        with self._lock:
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
            self._why = f"disconnected: {reason}"
            early = self._connack is not None and now - self._connack < EARLY
            self._connack = None
            if code == SESSION_TAKEN_OVER:
                self._early = 0
                self._why = "disconnected: session taken over by another client with its client id"
                return "reason"
            if not from_broker and code == _UNSPECIFIED and early:
                self._early += 1
                if self._early >= STREAK:
                    self._early = 0
                    return "pattern"
                return None
            self._early = 0
            return None

    def unready(self, timeout: float) -> str | None:
        """Why the bridge is not ready (its MQTT side), or None."""
        with self._lock:
            if not self._subscribed_once:
                return f"not yet connected and subscribed to the MQTT broker {self.where} ({self._why})"
            if self._down_since is None:
                return None
            down = self._clock() - self._down_since
            if down < timeout:
                return None
            return f"MQTT broker {self.where} unreachable for {down:.0f}s ({self._why})"
