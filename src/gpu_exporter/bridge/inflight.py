"""What the bridge holds unacknowledged, bounded in messages and in bytes, whatever the broker does.

MQTT 5's Receive Maximum asks the broker to send at most that many unacknowledged messages, but a
broker may ignore it (Mosquitto 2.0.11 sent a slow subscriber thousands), and it says nothing about
bytes. So the bridge keeps its own account: paho's network thread ``admit``\\ s each batch message
before queueing it, and waits while the account is full. While it waits paho reads nothing more from
the socket: TCP backpressure stops the broker, which keeps the rest in the bridge's session. The writer
``claim``\\ s the messages it wrote (those whose acknowledgement is its to send), acknowledges them, then
``release``\\ s them, which lets paho go on.

A message is always admitted when nothing is held, so one message larger than the byte bound (up to
the Maximum Packet Size the bridge announces) still gets through.

After a reconnection the broker sends again, flagged as duplicates, the messages it has not had
acknowledged, with their packet identifiers: one the bridge still holds is skipped (its
acknowledgement will come). A broker reuses an identifier only once it had the acknowledgement, so a
new message (not a duplicate) with the identifier of one still held means the held copy was already
acknowledged: the new one is admitted, and the held copy will not be acknowledged a second time.

While paho waits here the broker's packets wait in its output buffer and the socket, *after* the broker
stamped their Message Expiry Interval (Mosquitto 2.0.11 writes a connected subscriber its whole queue at
once, far past the Receive Maximum): that wait is invisible in the stamp and would read as a node's clock
behind (bridge/clock.py). So the account also says how long a message read now may have waited unseen:
from the first wait of a backlog (the moment paho stopped reading) until the account has gone
``SETTLE_S`` without a wait (paho kept up with the socket, so it has drained), and 0 outside a backlog.

While paho waits here it sends no keep-alive; a wait longer than the keep-alive makes the broker close
the connection, and paho reconnects once the wait is over. Nothing is lost: the session keeps every
unacknowledged message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Protocol, TypeVar

__all__ = ["SETTLE_S", "Inflight"]

SETTLE_S = 5.0  # seconds without a wait at the bound after which the socket counts as drained


class _Held(Protocol):
    @property
    def mid(self) -> int: ...
    @property
    def qos(self) -> int: ...
    @property
    def payload(self) -> bytes: ...


H = TypeVar("H", bound=_Held)


class Inflight:
    """The account of messages received and not yet released. Thread-safe."""

    def __init__(self, max_messages: int, max_bytes: int, stop: threading.Event) -> None:
        if max_messages < 1 or max_bytes < 1:
            raise ValueError("the in-flight bounds must be positive")
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._stop = stop
        self._cond = threading.Condition()
        self._count = 0
        self._bytes = 0
        self._held: dict[int, object] = {}  # packet id -> the message holding it (QoS 1)
        self.waited = 0.0  # seconds paho's thread spent waiting at the bound
        self.redelivered = 0  # duplicates of held messages, skipped
        self._backlog_since: float | None = None  # monotonic: the first wait of the current backlog
        self._last_wait = 0.0  # monotonic: when the last wait at the bound ended (or now, while waiting)
        self._waiting = False

    def unseen(self) -> float:
        """Seconds a message paho reads now may have waited in the socket or the broker's output buffer
        since the broker stamped it: the time since the current backlog began, else 0."""
        now = time.monotonic()
        with self._cond:
            if self._backlog_since is None:
                return 0.0
            if not self._waiting and now - self._last_wait > SETTLE_S:
                self._backlog_since = None  # paho kept up for SETTLE_S: the socket has drained
                return 0.0
            return now - self._backlog_since

    def admit(self, msg: _Held, dup: bool) -> bool:
        """Count ``msg`` in, waiting while the account is full. False when it is not to be queued: a
        redelivery of a message still held, or the bridge is stopping (then it stays unacknowledged and
        the broker keeps it)."""
        size = len(msg.payload)
        with self._cond:
            if dup and msg.qos and msg.mid in self._held:
                self.redelivered += 1
                return False
            if self._full(size):
                start = time.monotonic()
                if self._backlog_since is None or start - self._last_wait > SETTLE_S:
                    self._backlog_since = start
                self._waiting = True
                try:
                    while self._full(size):
                        if self._stop.is_set():
                            return False
                        self._cond.wait(0.25)
                finally:
                    self._waiting = False
                    self._last_wait = time.monotonic()
                    self.waited += self._last_wait - start
            self._count += 1
            self._bytes += size
            if msg.qos:
                self._held[msg.mid] = msg
            return True

    def _full(self, size: int) -> bool:
        return self._count > 0 and (self._count >= self.max_messages or self._bytes + size > self.max_bytes)

    def claim(self, msgs: Iterable[H]) -> list[H]:
        """The messages of ``msgs`` whose acknowledgement is still to be sent (each once)."""
        out = []
        with self._cond:
            for m in msgs:
                if m.qos and self._held.get(m.mid) is m:
                    del self._held[m.mid]
                    out.append(m)
        return out

    def release(self, msgs: Iterable[_Held]) -> None:
        """Take ``msgs`` out of the account (after their acknowledgements were handed to paho)."""
        with self._cond:
            for m in msgs:
                self._count -= 1
                self._bytes -= len(m.payload)
                if m.qos and self._held.get(m.mid) is m:  # released unacknowledged (stopping)
                    del self._held[m.mid]
            self._cond.notify_all()

    def usage(self) -> tuple[int, int]:
        """(messages, bytes) held now."""
        with self._cond:
            return self._count, self._bytes
