"""Framing: a payload's bytes (zlib with a preset dictionary, gzip, or plain) to its JSON document, with
the size of the input and of the inflated text bounded. Every failure is a PayloadError."""

from __future__ import annotations

import json
import zlib
from typing import Any

from gpu_exporter.payload._zdict import ZDICT, ZDICT_HEALTH, ZDICT_SUMMARY, ZDICT_V2
from gpu_exporter.payload.types import GZIP_MAGIC, PayloadError

_ZDICTS = {
    zlib.adler32(d).to_bytes(4, "big"): d for d in (ZDICT, ZDICT_SUMMARY, ZDICT_V2, ZDICT_HEALTH)
}  # by the id a zlib header names


# A compressed payload may inflate to INFLATE_FLOOR, or to INFLATE_RATIO times its own size, whichever is
# more (and never beyond max_bytes); the inflater stops there, before the rest is materialised. Batches
# inflate 3 to 8 times (simulated 8-GPU nodes); a batch of a whole day of idle readings, every value
# still, about 100 times, under the floor. A zlib bomb inflates about 1000 times. The bridge's reader
# (columns.py) applies the ratio; decode, which reads what this agent wrote, only max_bytes.
INFLATE_FLOOR = 1024 * 1024
INFLATE_RATIO = 128


def inflate_limit(compressed: int, max_bytes: int) -> int:
    """How far a compressed payload of ``compressed`` bytes may inflate."""
    return min(max_bytes, max(INFLATE_FLOOR, INFLATE_RATIO * compressed))


def one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def parse(data: bytes | bytearray | memoryview, max_bytes: int) -> Any:
    """The JSON document of a payload (zlib, gzip or plain)."""
    return parse_text(unframe(data, max_bytes))


def unframe(data: bytes | bytearray | memoryview, max_bytes: int, ratio_bound: bool = False) -> bytes:
    """The JSON text of a payload: inflated (to ``max_bytes`` at most, or with ``ratio_bound`` to
    ``inflate_limit``), or as it is when it is plain."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PayloadError(f"payload must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if len(data) > max_bytes:
        raise PayloadError(f"payload of {len(data)} bytes exceeds the {max_bytes}-byte limit")
    gzip = data[:2] == GZIP_MAGIC
    if gzip or is_zlib(data):
        limit = inflate_limit(len(data), max_bytes) if ratio_bound else max_bytes
        try:
            return gunzip(data, limit) if gzip else inflate(data, limit)
        except PayloadError as exc:
            if limit < max_bytes and "inflates beyond" in str(exc):
                raise PayloadError(
                    f"payload inflates beyond {INFLATE_RATIO} times its {len(data)} bytes (limit {limit} bytes): "
                    "a compression bomb?"
                ) from None
            raise
    if data.lstrip(b" \t\r\n")[:1] == b"{":
        return data
    if not data:
        raise PayloadError("empty payload")
    raise PayloadError(f"not a batch payload: starts with {data[:8]!r} (expected zlib, gzip or '{{')")


def parse_text(text: bytes) -> Any:
    """JSON text to its document with the standard library: NaN and Infinity literals refused."""
    try:
        return json.loads(text.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError as exc:
        raise PayloadError(f"payload is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise PayloadError(f"payload is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise PayloadError("payload JSON is nested too deeply") from None


def gunzip(data: bytes, max_bytes: int) -> bytes:
    return _finish(zlib.decompressobj(wbits=16 + zlib.MAX_WBITS), data, max_bytes, "gzip")


def is_zlib(data: bytes) -> bool:
    """A zlib stream (RFC 1950) with a preset dictionary: deflate, a valid header check, FDICT set."""
    return len(data) >= 2 and data[0] & 0x0F == 8 and data[0] >> 4 <= 7 and (data[0] << 8 | data[1]) % 31 == 0


def zlib_inflater(data: bytes) -> Any:
    if not data[1] & 0x20:
        raise PayloadError("zlib payload without the preset dictionary")
    if len(data) < 6:
        raise PayloadError("truncated zlib payload")
    zdict = _ZDICTS.get(data[2:6])
    if zdict is None:
        raise PayloadError(f"zlib payload with an unknown preset dictionary (id {data[2:6].hex()})")
    return zlib.decompressobj(wbits=zlib.MAX_WBITS, zdict=zdict)


def inflate(data: bytes, max_bytes: int) -> bytes:
    return _finish(zlib_inflater(data), data, max_bytes, "zlib")


def _finish(inflater: Any, data: bytes, max_bytes: int, kind: str) -> bytes:
    try:
        text: bytes = inflater.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise PayloadError(f"corrupt {kind} payload: {exc}") from None
    if len(text) > max_bytes:
        raise PayloadError(f"payload inflates beyond the {max_bytes}-byte limit")
    if not inflater.eof:
        raise PayloadError(f"truncated {kind} payload")
    if inflater.unused_data:
        raise PayloadError(f"trailing bytes after the {kind} payload")
    return text


def reject_constant(name: str) -> Any:
    raise PayloadError(f'payload uses the non-JSON number {name} (write "NaN", "+Inf" or "-Inf")')
