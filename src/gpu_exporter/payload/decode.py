"""Decoding: a payload to its batch (``decode``), and the cheaper checks of one (``verify``, ``peek``).
They trust nothing: anything malformed raises PayloadError (one line a log can carry), never another
exception."""

from __future__ import annotations

import zlib

from gpu_exporter.payload.document import from_document, read_header
from gpu_exporter.payload.frame import is_zlib, one_line, parse, zlib_inflater
from gpu_exporter.payload.types import (
    DEFAULT_MAX_BYTES,
    FORMAT,
    GZIP_MAGIC,
    VERSION,
    VERSIONS,
    Batch,
    Header,
    PayloadError,
)

__all__ = ["decode", "peek", "verify"]


def decode(data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> Batch:
    """The batch in ``data`` (zlib, gzip or plain JSON). Raises PayloadError, and only that, when invalid."""
    try:
        return _decode(data, max_bytes)
    except PayloadError:
        raise
    except Exception as exc:  # defensive: a malformed payload must never escape as anything else
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {one_line(str(exc))}") from None


def _decode(data: bytes | bytearray | memoryview, max_bytes: int) -> Batch:
    return from_document(parse(data, max_bytes))


_PREAMBLES = {v: f'{{"format":"{FORMAT}","version":{v},'.encode() for v in VERSIONS}


def verify(data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
    """Integrity check of a payload this encoder wrote (a spooled batch): the zlib (or gzip) stream
    inflates in full with a matching checksum and length, and starts with a known preamble. Inflates in
    small chunks and keeps nothing, so it costs next to no memory. Plain JSON gets the ``peek`` check
    instead. Raises PayloadError, and only that."""
    try:
        raw = bytes(data)
        if raw[:2] == GZIP_MAGIC:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        elif is_zlib(raw):
            inflater = zlib_inflater(raw)
        else:
            peek(raw, max_bytes)
            return
        size = len(_PREAMBLES[VERSION])
        head = inflater.decompress(raw, size)
        if head not in _PREAMBLES.values():
            raise PayloadError("not a batch written by this encoder")
        total = len(head)
        while not inflater.eof:
            chunk = inflater.decompress(inflater.unconsumed_tail, 65536)
            total += len(chunk)
            if total > max_bytes:
                raise PayloadError(f"payload inflates beyond the {max_bytes}-byte limit")
            if not chunk and not inflater.unconsumed_tail:
                raise PayloadError(f"truncated {'gzip' if raw[:2] == GZIP_MAGIC else 'zlib'} payload")
        if inflater.unused_data:
            raise PayloadError("trailing bytes after the compressed payload")
    except PayloadError:
        raise
    except zlib.error as exc:
        raise PayloadError(f"corrupt compressed payload: {exc}") from None
    except Exception as exc:  # defensive, as in decode
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {one_line(str(exc))}") from None


def peek(data: bytes | bytearray | memoryview, max_bytes: int = DEFAULT_MAX_BYTES) -> Header:
    """Check framing, JSON and the batch header without building samples (a fraction of ``decode``'s
    cost): what the forwarder runs on a spooled batch before publishing it, and what a receiver can use
    to drop a repeat by (node, boot, seq) before decoding. Raises PayloadError, and only that."""
    try:
        doc = parse(data, max_bytes)
        return read_header(doc)
    except PayloadError:
        raise
    except Exception as exc:  # defensive, as in decode
        raise PayloadError(f"invalid payload: {type(exc).__name__}: {one_line(str(exc))}") from None
