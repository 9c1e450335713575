"""The health summary: ``gpu_health{subsystem}`` (0 ok, 1 warning, 2 failure) from what a backend read.

Computed by the backend once per sample, from that sample's values and a short history of the
counters (rates need two points), so a scrape only serves numbers. A subsystem appears only when the
device reported at least one of its inputs. The rules and thresholds are documented in docs/health.md;
the constants below are the single source of them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

from gpu_exporter import catalog
from gpu_exporter.model import SeriesKey

__all__ = [
    "FAILURE",
    "FAILURE_XIDS",
    "OK",
    "WARNING",
    "WARNING_XIDS",
    "HealthTracker",
]

OK, WARNING, FAILURE = 0.0, 1.0, 2.0

# XIDs that mean the GPU needs a reset or service (double-bit ECC, row-remap failure, NVLink error,
# fallen off the bus, uncontained ECC, GSP errors, unrecovered ECC) ...
FAILURE_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120, 140})
# ... and XIDs that a GPU survives but that announce trouble (page retirement / row remapping events,
# a high single-bit ECC rate, a contained ECC error, internal micro-controller warnings).
WARNING_XIDS = frozenset({61, 62, 63, 92, 94})
XID_HOLD_SECONDS = 3600.0  # an XID keeps its subsystem at its level this long after it last happened

WINDOW_SECONDS = 60.0  # rates (PCIe replays, throttle time) are taken over about this much history
PCIE_REPLAYS_PER_MINUTE = 8.0  # warning above this replay rate (link degrading)
RETIRED_PAGES_FAILURE = 60  # retired pages at which the memory is out of spare pages to retire
THERMAL_WARNING, THERMAL_FAILURE = 0.10, 0.50  # share of the window held down for heat
POWER_WARNING = 0.50  # share of the window held down by the power limit


def _counter(subsystem: str) -> str:
    """The one counter whose rate the rule of ``subsystem`` judges (its catalog health role)."""
    keys = [k for k in catalog.health_inputs(subsystem) if catalog.by_key(k).type == "counter"]
    if len(keys) != 1:
        raise ValueError(f"gpu_health{{subsystem={subsystem!r}}} needs one counter in the catalog, not {keys}")
    return keys[0]


# the inputs of the rules, from the catalog (each entry's health role)
_MEMORY_KEYS = catalog.health_inputs("memory")
_REPLAYS, _THERMAL, _POWER = _counter("pcie"), _counter("thermal"), _counter("power")
_COUNTERS = (_REPLAYS, _THERMAL, _POWER)


@dataclass
class _State:
    xid_counts: dict[str, float] = field(default_factory=dict)
    xid_last_seen: dict[int, float] = field(default_factory=dict)  # code -> when its count last rose
    history: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)


class HealthTracker:
    """Per-device state between samples; ``evaluate`` returns the ``health`` series for one sample."""

    def __init__(self) -> None:
        self._states: dict[Hashable, _State] = {}

    def forget(self, device: Hashable) -> None:
        self._states.pop(device, None)

    def evaluate(self, device: Hashable, values: Mapping[SeriesKey, float], now: float) -> dict[SeriesKey, float]:
        state = self._states.setdefault(device, _State())
        out: dict[SeriesKey, float] = {}
        xid = self._xid(state, values, now)
        if xid is not None:
            out[("health", ("xid",))] = xid
        memory = _memory(values)
        if memory is not None:
            out[("health", ("memory",))] = memory
        rates = self._rates(state, values, now)
        if (_REPLAYS, ()) in values:
            per_minute = rates.get(_REPLAYS, 0.0) * 60.0
            out[("health", ("pcie",))] = WARNING if per_minute > PCIE_REPLAYS_PER_MINUTE else OK
        if (_THERMAL, ()) in values:
            share = rates.get(_THERMAL, 0.0)
            level = FAILURE if share >= THERMAL_FAILURE else WARNING if share >= THERMAL_WARNING else OK
            out[("health", ("thermal",))] = level
        if (_POWER, ()) in values:
            share = rates.get(_POWER, 0.0)
            out[("health", ("power",))] = WARNING if share >= POWER_WARNING else OK
        return out

    @staticmethod
    def _xid(state: _State, values: Mapping[SeriesKey, float], now: float) -> float | None:
        counts = {labels[0]: value for (key, labels), value in values.items() if key == "xid_errors" and labels}
        if not counts and ("xid_last", ()) not in values:
            return None
        for code, count in counts.items():
            if count > state.xid_counts.get(code, 0.0) and code.isdigit():
                state.xid_last_seen[int(code)] = now
        state.xid_counts = counts
        level = OK
        for xid, seen in list(state.xid_last_seen.items()):
            if now - seen > XID_HOLD_SECONDS:
                del state.xid_last_seen[xid]
            elif xid in FAILURE_XIDS:
                level = FAILURE
            elif xid in WARNING_XIDS:
                level = max(level, WARNING)
        return level

    @staticmethod
    def _rates(state: _State, values: Mapping[SeriesKey, float], now: float) -> dict[str, float]:
        """Per-second increase of each counter over the history window (a counter reset counts as 0)."""
        current = {key: values[(key, ())] for key in _COUNTERS if (key, ()) in values}
        history = state.history
        while len(history) > 1 and now - history[1][0] >= WINDOW_SECONDS:
            history.popleft()
        rates: dict[str, float] = {}
        if history:
            then, old = history[0]
            span = now - then
            if span > 0:
                for key, value in current.items():
                    if key in old:
                        rates[key] = max(0.0, value - old[key]) / span
        history.append((now, current))
        return rates


def _memory(values: Mapping[SeriesKey, float]) -> float | None:
    present = {key: values[(key, ())] for key in _MEMORY_KEYS if (key, ()) in values}
    if not present:
        return None
    retired = present.get("retired_pages_sbe", 0.0) + present.get("retired_pages_dbe", 0.0)
    if present.get("remapped_rows_failure", 0.0) > 0 or retired >= RETIRED_PAGES_FAILURE:
        return FAILURE
    if present.get("ecc_uncorrected_volatile", 0.0) > 0:
        return FAILURE
    if present.get("remapped_rows_pending", 0.0) > 0 or present.get("retired_pages_dbe", 0.0) > 0:
        return WARNING
    return OK
