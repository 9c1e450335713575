"""Health reports: the agent's own metrics in a payload of their own (docs/payload.md, "Health reports").

A health report is a batch document with one more field, ``health``, and one sample without devices:
its ``seq`` is the report's own number (1, 2, ... per agent boot, apart from the samples' numbers) and its
``time_ms`` the moment the agent read its metrics. ``health`` lists ``[name, [label, value, ...], value]``:
a metric of the agent's page by its name there (a counter's with ``_total``), its labels flat, its value.
What a reader checks: names are Prometheus metric names, label names are label names (never ``__*``), no
series twice, values finite, at most ``MAX_HEALTH`` values of at most ``MAX_HEALTH_LABELS`` labels each,
and the report holds no samples' data (no ``metrics``, no ``devices``, no ``summary_ms`` nor ``part``).
"""

from __future__ import annotations

import math
from typing import Any

from gpu_exporter.payload.types import (
    LABEL_NAME,
    MAX_HEALTH,
    MAX_HEALTH_LABELS,
    MAX_TEXT,
    METRIC_NAME,
    Batch,
    HealthValue,
    PayloadError,
)

__all__ = ["check_report", "health_document", "read_health"]

_NAME_LIMIT = 128


def read_health(doc: dict[str, Any]) -> tuple[HealthValue, ...]:
    """The ``health`` field of a parsed document (``()`` when absent), checked; PayloadError when invalid."""
    raw = doc.get("health")
    if raw is None and "health" not in doc:
        return ()
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_HEALTH:
        raise PayloadError(f"health must be an array of 1 to {MAX_HEALTH} values")
    if doc.get("metrics") or doc.get("devices") or "summary_ms" in doc or "part" in doc:
        raise PayloadError("a health report holds no metrics, devices, summary_ms or part")
    if len(doc.get("seq") or ()) != 1:
        raise PayloadError("a health report has exactly one entry in seq")
    out: list[HealthValue] = []
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for i, item in enumerate(raw):
        where = f"health[{i}]"
        if not isinstance(item, list) or len(item) != 3:
            raise PayloadError(f"{where} must be [name, [label, value, ...], value]")
        name, flat, value = item
        if not isinstance(name, str) or len(name) > _NAME_LIMIT or not METRIC_NAME.match(name):
            raise PayloadError(f"{where}: invalid metric name {str(name)[:40]!r}")
        if not isinstance(flat, list) or len(flat) % 2 or len(flat) > 2 * MAX_HEALTH_LABELS:
            raise PayloadError(f"{where}: labels must be [name, value, ...], at most {MAX_HEALTH_LABELS} pairs")
        labels = tuple(zip(flat[::2], flat[1::2], strict=True))
        for label, text in labels:
            if not isinstance(label, str) or len(label) > _NAME_LIMIT or not LABEL_NAME.match(label):
                raise PayloadError(f"{where}: invalid label name {str(label)[:40]!r}")
            if label.startswith("__"):
                raise PayloadError(f"{where}: label names starting with __ are reserved")
            if not isinstance(text, str) or len(text) > MAX_TEXT:
                raise PayloadError(f"{where}: label {label} must be a string of at most {MAX_TEXT} characters")
        if len({label for label, _ in labels}) != len(labels):
            raise PayloadError(f"{where}: a label is given twice")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
            raise PayloadError(f"{where}: the value must be a finite number")
        series = (name, labels)
        if series in seen:
            raise PayloadError(f"{where}: series {name} is listed twice")
        seen.add(series)
        out.append(HealthValue(name, labels, float(value)))
    return tuple(out)


def check_report(batch: Batch) -> None:
    """ValueError unless ``batch`` is a health report the readers take (what ``read_health`` checks)."""
    if len(batch.samples) != 1 or batch.samples[0].devices or batch.summary_ms or batch.part:
        raise ValueError("a health report is one sample without devices, no summary, no part")
    if not 0 < len(batch.health) <= MAX_HEALTH:
        raise ValueError(f"a health report holds 1 to {MAX_HEALTH} values")
    seen = set()
    for name, labels, value in batch.health:
        if len(name) > _NAME_LIMIT or not METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if len(labels) > MAX_HEALTH_LABELS or len({k for k, _ in labels}) != len(labels):
            raise ValueError(f"invalid labels of {name}")
        for label, text in labels:
            if len(label) > _NAME_LIMIT or not LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"invalid label name {label!r} of {name}")
            if len(text) > MAX_TEXT:
                raise ValueError(f"label {label} of {name} is over {MAX_TEXT} characters")
        if not math.isfinite(value):
            raise ValueError(f"{name}: a health value must be finite")
        if (name, labels) in seen:
            raise ValueError(f"series {name} twice in a health report")
        seen.add((name, labels))


def health_document(batch: Batch) -> list[Any]:
    """The ``health`` field of a report's document: integers written as integers (shorter)."""
    out: list[Any] = []
    for name, labels, value in batch.health:
        value = float(value)
        number: float | int = int(value) if value.is_integer() and abs(value) < 2**53 else value
        out.append([name, [x for pair in labels for x in pair], number])
    return out
