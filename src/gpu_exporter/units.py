"""Parsing of the human units users type: durations (500ms, 5s, 1m) and sizes (64MiB, 1GB)."""

from __future__ import annotations

import re

__all__ = ["MAX_DURATION", "MAX_SIZE", "format_duration", "parse_duration", "parse_size"]

# Ceilings past any sensible setting, so that an absurd value is a clear error rather than an overflow
# in a timer or an allocation: ten years, one pebibyte. Options set tighter bounds of their own.
MAX_DURATION = 3650 * 86400.0
MAX_SIZE = 1 << 50

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "m": 1000**2,
    "g": 1000**3,
    "t": 1000**4,
    "ki": 1024,
    "mi": 1024**2,
    "gi": 1024**3,
    "ti": 1024**4,
}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``500ms``, ``5s``, ``1.5m``, ``2h``, ``1d``, or a bare number of seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"invalid duration {text!r} (use e.g. 500ms, 5s, 1m, 2h)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not seconds <= MAX_DURATION:
        raise ValueError(f"duration {text!r} is out of range (at most 3650d)")
    return seconds


def format_duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def parse_size(text: str) -> int:
    """Bytes in ``text``: ``1048576``, ``64MiB``, ``1GB``, ``512k``."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"invalid size {text!r} (use e.g. 512MiB, 1GiB, 100MB)")
    unit = (match.group(2) or "").lower().rstrip("b")
    size = float(match.group(1)) * _SIZE_UNITS[unit]
    if not size <= MAX_SIZE:
        raise ValueError(f"size {text!r} is out of range (at most 1PiB)")
    return int(size)
