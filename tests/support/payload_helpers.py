"""What agents of earlier payload versions sent: the same batch as a version 2 or version 1 document."""

from __future__ import annotations

import copy
import gzip
import itertools
import json
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from gpu_exporter.payload import PayloadError
from gpu_exporter.payload._zdict import ZDICT_V2
from gpu_exporter.payload.document import read_columns
from gpu_exporter.payload.encode import json_value
from gpu_exporter.payload.types import HAS_STEP

T = TypeVar("T")


def as_v2(doc: dict[str, Any]) -> dict[str, Any]:
    """A version 3 document rewritten in the version 2 layout, value for value: a bare constant becomes
    ``{"const": v}``, a delta array ``{"delta": [...], "scale", "step", "order"}``, a reference the
    column of plain values it stands for."""
    out = copy.deepcopy(doc)
    out["version"] = 2
    n = len(out["seq"])
    for d, dev in enumerate(out["devices"]):
        values = read_columns(f"devices[{d}]", dev["columns"], n, 3)
        for j, col in enumerate(dev["columns"]):
            if col is None or (isinstance(col, dict) and "values" in col):
                continue
            if isinstance(col, list):
                form, rest = col[0], col[1:]
                column: dict[str, Any] = {}
                if form >= HAS_STEP:
                    column["step"], rest = rest[0], rest[1:]
                    form -= HAS_STEP
                column["delta"] = rest
                if form % 10:
                    column["scale"] = form % 10
                if form >= 10:
                    column["order"] = 2
                dev["columns"][j] = column
            elif isinstance(col, dict):  # a reference
                dev["columns"][j] = {"values": [json_value(v) for v in values[j]]}  # type: ignore[union-attr]
            else:
                dev["columns"][j] = {"const": col}
    return out


def as_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """A version 3 (or 2) document rewritten in the version 1 layout, value for value: a constant column
    becomes a column of plain values, a column of second-order deltas one of first-order deltas."""
    out = as_v2(doc) if doc["version"] == 3 else copy.deepcopy(doc)
    out["version"] = 1
    n = len(out["seq"])
    for dev in out["devices"]:
        for j, col in enumerate(dev["columns"]):
            if col is None:
                continue
            if "const" in col:
                dev["columns"][j] = {"values": [col["const"]] * n}
            elif col.pop("order", 1) == 2:
                d = col["delta"]
                col["delta"] = d[:1] + list(itertools.accumulate(d[1:]))
    return out


def v1_payload(doc: dict[str, Any]) -> bytes:
    """gzip-compressed JSON, as version 1 agents framed their batches."""
    return gzip.compress(json.dumps(as_v1(doc), separators=(",", ":")).encode(), mtime=0)


def v2_payload(doc: dict[str, Any]) -> bytes:
    """zlib with the version 2 preset dictionary, as version 2 agents framed their batches."""
    text = json.dumps(as_v2(doc), separators=(",", ":")).encode()
    deflater = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, ZDICT_V2)
    return deflater.compress(text) + deflater.flush()


def strictly(reader: Callable[[bytes], T], data: bytes) -> T | None:
    """``reader(data)``, or None when it refuses the payload with one of its own checks.

    The public readers (``batch.decode``, ``peek``, ``verify``, ``columns.read``) turn any other exception
    into ``PayloadError("invalid payload: <type>: ...")`` so that nothing else escapes to a caller. A fuzz
    test that accepted any PayloadError would therefore pass with an IndexError or KeyError planted in the
    decoder; this one fails on that wrapper's message, so only deliberate refusals pass.
    """
    try:
        return reader(data)
    except PayloadError as exc:
        assert not str(exc).startswith("invalid payload:"), f"{getattr(reader, '__name__', reader)}: {exc}"
        return None
