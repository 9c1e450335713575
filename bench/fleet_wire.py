"""MQTT 5 packets as the agent's paho client writes them, for the fleet bench's lean publisher.

One Python process cannot run 5,000 paho clients (a thread-free paho client still costs a socket pair
and hundreds of Python calls per packet), so the bench writes the few packets an agent sends by hand:
CONNECT (clean start, keepalive, Maximum Packet Size, a retained QoS 1 last will ``offline``), the
retained QoS 1 status ``online``, QoS 1 PUBLISH of a batch stamped with the send time
(``mqtt/sendtime.py``: Message Expiry Interval, then the user property ``sent``, in paho's order),
PINGREQ and DISCONNECT. tests/unit/bench/test_bench_fleet_wire.py checks these bytes against what the agent's own
``Link`` (paho) puts on the wire for the same node, payload and clock.
"""

from __future__ import annotations

import struct

__all__ = [
    "CONNACK",
    "DISCONNECT",
    "PINGREQ",
    "PINGRESP",
    "PUBACK",
    "PUBLISH",
    "connect",
    "publish",
    "read_varint",
    "remaining_length",
]

CONNECT = 0x10
CONNACK = 0x20
PUBLISH = 0x30
PUBACK = 0x40
PINGREQ = 0xC0
PINGRESP = 0xD0
DISCONNECT = 0xE0

_MESSAGE_EXPIRY = 0x02
_USER_PROPERTY = 0x26
_MAXIMUM_PACKET_SIZE = 0x27


def remaining_length(n: int) -> bytes:
    """MQTT's variable byte integer."""
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(data: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """(value, position after it) of a variable byte integer at ``pos``; None when incomplete."""
    value, shift = 0, 0
    for i in range(pos, min(pos + 4, len(data))):
        value |= (data[i] & 0x7F) << shift
        if not data[i] & 0x80:
            return value, i + 1
        shift += 7
    return None


def _str16(value: bytes) -> bytes:
    return struct.pack("!H", len(value)) + value


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + remaining_length(len(body)) + body


def connect(
    client_id: str,
    keepalive: int,
    will_topic: str,
    will_payload: bytes = b"offline",
    max_packet: int = 64 * 1024,
) -> bytes:
    """CONNECT of an MQTT 5 agent: clean start, a retained QoS 1 will, Maximum Packet Size announced."""
    flags = 0x02 | 0x04 | (1 << 3) | 0x20  # clean start, will, will QoS 1, will retain
    props = bytes((_MAXIMUM_PACKET_SIZE,)) + struct.pack("!I", max_packet)
    body = (
        _str16(b"MQTT")
        + bytes((5, flags))
        + struct.pack("!H", keepalive)
        + remaining_length(len(props))
        + props
        + _str16(client_id.encode())
        + b"\x00"  # no will properties
        + _str16(will_topic.encode())
        + _str16(will_payload)
    )
    return _packet(CONNECT, body)


def sent_properties(sent_ms: int, expiry_s: int) -> bytes:
    """The send-time stamp of a batch's PUBLISH: Message Expiry Interval, then user property ``sent``."""
    props = (
        bytes((_MESSAGE_EXPIRY,))
        + struct.pack("!I", expiry_s)
        + bytes((_USER_PROPERTY,))
        + _str16(b"sent")
        + _str16(str(sent_ms).encode())
    )
    return remaining_length(len(props)) + props


def publish(topic: str, payload: bytes, mid: int, retain: bool = False, properties: bytes = b"\x00") -> bytes:
    """A QoS 1 PUBLISH; ``properties`` already encoded with their length (``sent_properties``)."""
    body = _str16(topic.encode()) + struct.pack("!H", mid) + properties + payload
    return _packet(PUBLISH | 0x02 | (0x01 if retain else 0), body)


PINGREQ_PACKET = bytes((PINGREQ, 0))
DISCONNECT_PACKET = bytes((DISCONNECT, 0))
