"""Label limits: what the bridge lets into a series' label set, whatever a payload carries.

The series of the catalog have a fixed, short label set (the device's identity labels, the catalog's
constant and dynamic labels, the node); values are at most 1024 characters (the payload codec's bound).
What a payload chooses freely is the set of identity strings of ``gpu_info``: each key becomes a label.
So for ``gpu_info``:

* a key must be a valid Prometheus label name (``invalid_name``) of at most ``MAX_NAME_LENGTH``
  characters (``name_too_long``), not reserved (``__*``, or a label the bridge sets itself: the
  device's identity labels, ``__name__`` and the node label; ``reserved``);
* at most ``MAX_INFO_LABELS`` keys are kept, the first in sorted order (``too_many``);
* a key with an empty value is left out quietly (Prometheus reads an empty label as an absent one).

Every key left out is counted by reason. With the device's identity labels (6 at most), ``__name__``
and the node label, ``gpu_info`` has at most 40 labels, and no series the bridge writes more than
``MAX_LABELS``.
"""

from __future__ import annotations

import re
from collections.abc import Collection

__all__ = ["MAX_INFO_LABELS", "MAX_LABELS", "MAX_NAME_LENGTH", "MAX_VALUE_LENGTH", "info_labels", "refusal"]

MAX_LABELS = 64
MAX_INFO_LABELS = 32
MAX_NAME_LENGTH = 128
MAX_VALUE_LENGTH = 1024  # the payload codec's own bound on any text
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def refusal(name: str) -> str | None:
    """Why ``name`` cannot be a label the bridge writes from a payload, None when it can."""
    if len(name) > MAX_NAME_LENGTH:
        return "name_too_long"
    if not _NAME.fullmatch(name):
        return "invalid_name"
    if name.startswith("__"):
        return "reserved"
    return None


def info_labels(info: dict[str, str], reserved: Collection[str]) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The labels ``gpu_info`` gets from a device's identity strings, and what was left out, by reason."""
    kept: list[tuple[str, str]] = []
    dropped: dict[str, int] = {}
    for key in sorted(info):
        value = info[key]
        why = refusal(key) or ("reserved" if key in reserved else None)
        if why is None and len(value) > MAX_VALUE_LENGTH:
            why = "value_too_long"
        if why is None and len(kept) >= MAX_INFO_LABELS:
            why = "too_many"
        if why is not None:
            dropped[why] = dropped.get(why, 0) + 1
        elif value:
            kept.append((key, value))
    return kept, dropped
