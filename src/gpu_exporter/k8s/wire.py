"""The protobuf wire format, read by hand: the kubelet's pod-resources answer is the only message the
agent decodes, and a protobuf runtime would cost more than these few lines."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["fields", "messages", "split", "strings", "text"]


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of one message."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated field")
        yield number, wire, value


def text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ValueError("expected a string field")
    return value.decode("utf-8", errors="replace")


def messages(data: bytes, number: int) -> Iterator[bytes]:
    """The embedded messages (or strings, as bytes) in field ``number`` of ``data``."""
    for n, wire, value in fields(data):
        if n == number and wire == 2 and isinstance(value, bytes):
            yield value


def split(data: bytes, wanted: frozenset[int]) -> dict[int, list[bytes]]:
    """The length-delimited values of the ``wanted`` fields, by field number, in order (others skipped)."""
    out: dict[int, list[bytes]] = {}
    for n, wire, v in fields(data):
        if n in wanted and wire == 2 and isinstance(v, bytes):
            out.setdefault(n, []).append(v)
    return out


def strings(data: bytes) -> dict[int, str]:
    """The last value of each length-delimited field, as text (proto3: the last one wins)."""
    return {n: text(v) for n, wire, v in fields(data) if wire == 2}
