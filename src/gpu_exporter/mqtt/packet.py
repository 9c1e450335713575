"""MQTT packets by size: how many bytes a PUBLISH takes (``publish_size``), the largest payload that fits
a Maximum Packet Size (``payload_budget``), and a socket wrapper that refuses an incoming packet over
the size announced in CONNECT before reading its body, and hands the kernel a young connection's
outgoing bytes in pieces TCP's timer covers (``PacketGuard``, mqtt/ramp.py)."""

from __future__ import annotations

import errno
from typing import Any

from gpu_exporter.mqtt import sendtime
from gpu_exporter.mqtt.ramp import SegmentRamp, quick_ack

__all__ = ["PacketGuard", "payload_budget", "publish_size"]

_CHUNK = 16 * 1024  # the most one read of a packet's body asks for


class PacketGuard:
    """The socket paho reads from, with each packet's fixed header parsed as it passes.

    paho-mqtt 2 reads an incoming packet whole before any callback can see its size, asking the socket
    for the rest of the packet in one recv() (which allocates that much at once). Through the guard a
    packet whose remaining length puts it over ``limit`` (the Maximum Packet Size the agent announced)
    is refused as soon as its header is in, before one byte of its body is read, and no read asks for
    more than ``_CHUNK`` bytes. With a ``ramp``, what paho writes goes to the kernel one piece at a
    time while the connection is young (mqtt/ramp.py): a write the ramp holds back raises
    ``BlockingIOError``, and paho keeps the rest of the packet for a later write; and what comes in is
    acknowledged at once, not on the next piece. Everything else is the socket's own.
    """

    def __init__(self, sock: Any, limit: int, ramp: SegmentRamp | None = None) -> None:
        self._sock = sock
        self.limit = limit
        self.ramp = ramp
        self.violation = 0  # the size of the packet refused (0: none)
        self._header: list[int] = []  # bytes of the current fixed header read so far
        self._body = 0  # bytes of the current packet's body still to come

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def holding(self) -> bool:
        """Whether the ramp holds writes back now (the piece handed last is not acknowledged yet)."""
        ramp = self.ramp
        allowed = ramp.allowance() if ramp is not None else None
        if allowed is None:
            self.ramp = None
            return False
        return allowed == 0

    def send(self, data: bytes | bytearray | memoryview, *flags: int) -> int:
        ramp = self.ramp
        allowed = ramp.allowance(len(data)) if ramp is not None else None
        if ramp is None or allowed is None:
            self.ramp = None
            return int(self._sock.send(data, *flags))
        if not allowed:
            raise BlockingIOError(errno.EAGAIN, "waiting for TCP to acknowledge the piece on the link")
        sent = int(self._sock.send(memoryview(data)[:allowed], *flags))
        ramp.sent(sent)
        return sent

    def recv(self, bufsize: int, *flags: int) -> bytes:
        if self.violation:
            raise ConnectionAbortedError(errno.ECONNABORTED, "packet over the Maximum Packet Size")
        data: bytes = self._sock.recv(min(bufsize, self._body, _CHUNK) if self._body else 1, *flags)
        if self.ramp is not None and data:
            quick_ack(self._sock)
        if self._body:
            self._body -= len(data)
            return data
        for byte in data:  # one byte: a packet type, or one of the remaining length's
            self._header.append(byte)
            if len(self._header) == 1 or (byte & 0x80 and len(self._header) < 5):
                continue
            length = sum((b & 0x7F) << (7 * i) for i, b in enumerate(self._header[1:]))
            total = len(self._header) + length
            self._header = []
            if total > self.limit or byte & 0x80:
                self.violation = total
                raise ConnectionAbortedError(errno.ECONNABORTED, "packet over the Maximum Packet Size")
            self._body = length
        return data


def _varint_len(n: int) -> int:
    return 1 if n < 128 else 2 if n < 16_384 else 3 if n < 2_097_152 else 4


def publish_size(topic: str, payload: int, v5: bool = True) -> int:
    """Bytes of a QoS 1 PUBLISH packet: fixed header, topic, packet id, properties (MQTT 5: the send-time
    stamp, at its largest), payload."""
    rest = 2 + len(topic.encode("utf-8")) + 2 + (sendtime.PACKED_MAX if v5 else 0) + payload
    return 1 + _varint_len(rest) + rest


def payload_budget(topic: str, max_packet: int, v5: bool = True) -> int:
    """The largest payload whose PUBLISH to ``topic`` fits in ``max_packet`` bytes (0 when none fits)."""
    budget = max(0, max_packet - publish_size(topic, 0, v5) - 3)  # the length field grows by 3 at most
    while budget >= 0 and publish_size(topic, budget + 1, v5) <= max_packet:
        budget += 1  # a few steps at most: hand back what the worst-case length field did not need
    return budget
