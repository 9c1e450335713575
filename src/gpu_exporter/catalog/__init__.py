"""Every device metric, once: its key, Prometheus name, type, unit, help, group and DCGM name.

Backends produce values keyed by ``Metric.key`` in base units (bytes, seconds, watts, joules, hertz,
ratios 0-1). Several keys may share one Prometheus family and tell themselves apart by constant
labels (``gpu_temperature_celsius{sensor="gpu"}`` and ``{sensor="memory"}``), so each DCGM field maps
to exactly one key. The README's metric table is generated from this package.

The entries live in ``core``, ``extended`` and ``vendors`` (in catalog order); ``metric`` defines one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpu_exporter.catalog import core, extended, vendors
from gpu_exporter.catalog.metric import Metric, MetricType

__all__ = [
    "CATALOG",
    "COUNTER_KEYS",
    "GROUPS",
    "INFO",
    "UP",
    "Family",
    "Metric",
    "by_key",
    "check",
    "families",
    "health_inputs",
    "kept_keys",
    "name_filter",
]

CATALOG: tuple[Metric, ...] = (*core.METRICS, *extended.METRICS, *vendors.METRICS)

# collector groups: one per metric group, plus "mig" (per-instance series of MIG devices)
GROUPS: tuple[str, ...] = (*dict.fromkeys(m.group for m in CATALOG), "mig")

_BY_KEY = {m.key: m for m in CATALOG}

# the keys of type counter: a reader of a batch checks that their values never go down within a boot
COUNTER_KEYS = frozenset(m.key for m in CATALOG if m.type == "counter")


def by_key(key: str) -> Metric:
    return _BY_KEY[key]


def health_inputs(*subsystems: str) -> tuple[str, ...]:
    """The keys the ``gpu_health`` rules of ``subsystems`` read (backends/health.py), in catalog order."""
    return tuple(m.key for m in CATALOG if m.health and m.health in subsystems)


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    type: MetricType
    help: str
    metrics: tuple[Metric, ...]


def families(metrics: Iterable[Metric] = CATALOG) -> tuple[Family, ...]:
    """Group catalog entries into Prometheus families, keeping catalog order."""
    grouped: dict[str, list[Metric]] = {}
    for m in metrics:
        grouped.setdefault(m.name, []).append(m)
    return tuple(Family(name, ms[0].type, ms[0].help, tuple(ms)) for name, ms in grouped.items())


# the two series every device has beside its readings: no backend writes them, so they have no key
UP = Family("gpu_up", "gauge", "1 when the device answered in the last collect cycle, else 0.", ())
INFO = Family("gpu_info", "gauge", "Device identity; the value is always 1.", ())


def check(metrics: Iterable[Metric]) -> None:
    """Refuse entries that contradict themselves; run on the catalog when it loads, so a slip in a new
    entry fails at import rather than on a page. Keys are unique; an entry with a DCGM field says its
    unit and what it measures (the DCGM page's help); one without says nothing about DCGM."""
    keys: set[str] = set()
    for m in metrics:
        if m.key in keys:
            raise ValueError(f"duplicate catalog key {m.key}")
        keys.add(m.key)
        if m.dcgm and not (m.dcgm_unit and m.dcgm_help):
            raise ValueError(f"catalog key {m.key}: DCGM field {m.dcgm} needs dcgm_unit and dcgm_help")
        if not m.dcgm and (m.dcgm_unit or m.dcgm_help or m.dcgm_type or m.dcgm_scale != 1.0):
            raise ValueError(f"catalog key {m.key}: DCGM unit, help, type or scale without a DCGM field")


check(CATALOG)


def markdown_table() -> str:
    """The README's metric list, generated so that it cannot drift from the code."""
    rows = ["| metric | type | labels | group | DCGM equivalent |", "|---|---|---|---|---|"]
    for fam in families():
        consts = sorted({f'{k}="{v}"' for m in fam.metrics for k, v in m.const_labels})
        dynamic = sorted({label for m in fam.metrics for label in m.labels})
        labels = ", ".join([*consts, *dynamic]) or "-"
        groups = ", ".join(dict.fromkeys(m.group for m in fam.metrics))
        dcgm = ", ".join(m.dcgm for m in fam.metrics if m.dcgm) or "-"
        rows.append(f"| `{fam.name}` | {fam.type} | {labels} | {groups} | {dcgm} |")
    return "\n".join(rows) + "\n"


def name_filter(include: str = "", exclude: str = "") -> Callable[[str], bool]:
    """``--metrics.include`` / ``--metrics.exclude`` as a predicate on metric names."""
    inc = re.compile(include) if include else None
    exc = re.compile(exclude) if exclude else None

    def keep(name: str) -> bool:
        if inc is not None and not inc.search(name):
            return False
        return not (exc is not None and exc.search(name))

    return keep


def kept_keys(include: str = "", exclude: str = "") -> frozenset[str] | None:
    """Catalog keys whose metric name passes the filter; None when nothing is filtered."""
    if not include and not exclude:
        return None
    keep = name_filter(include, exclude)
    return frozenset(m.key for m in CATALOG if keep(m.name))
