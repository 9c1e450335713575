"""What an agent of payload version 1 sent: the same batch as a version 1 document."""

from __future__ import annotations

import copy
import gzip
import itertools
import json
from typing import Any


def as_v1(doc: dict[str, Any]) -> dict[str, Any]:
    """A version 2 document rewritten in the version 1 layout, value for value: a constant column
    becomes a column of plain values, a column of second-order deltas one of first-order deltas."""
    out = copy.deepcopy(doc)
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
