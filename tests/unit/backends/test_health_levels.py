"""gpu_health's levels where several inputs meet (docs/health.md): the worst one wins, a repeated XID
holds its level for another hour, a counter reset is no burst, and the thresholds are inclusive.
The tracker is fed what a backend reads, sample by sample, with the clock passed in."""

from __future__ import annotations

from gpu_exporter.backends.health import (
    FAILURE,
    OK,
    RETIRED_PAGES_FAILURE,
    WARNING,
    XID_HOLD_SECONDS,
    HealthTracker,
)
from gpu_exporter.model import SeriesKey

GPU = "GPU-0"


def _xids(**counts: float) -> dict[SeriesKey, float]:
    """The XID counters of one sample, ``x79=1`` for one XID 79 so far, and the DCGM last-XID value."""
    values: dict[SeriesKey, float] = {("xid_errors", (code[1:],)): n for code, n in counts.items()}
    values[("xid_last", ())] = 0.0
    return values


def _level(tracker: HealthTracker, values: dict[SeriesKey, float], now: float, subsystem: str) -> float:
    return tracker.evaluate(GPU, values, now)[("health", (subsystem,))]


def test_a_warning_xid_after_a_failure_xid_leaves_the_gpu_failed() -> None:
    tracker = HealthTracker()
    assert _level(tracker, _xids(x79=0, x63=0), 0.0, "xid") == OK
    assert _level(tracker, _xids(x79=1, x63=0), 10.0, "xid") == FAILURE  # fallen off the bus
    # a row-remapping event (a warning XID) a minute later must not make it look better
    assert _level(tracker, _xids(x79=1, x63=1), 70.0, "xid") == FAILURE
    assert _level(tracker, _xids(x79=1, x63=2), 130.0, "xid") == FAILURE
    # an hour after the failure XID, the warning one (more recent) still holds
    assert _level(tracker, _xids(x79=1, x63=2), 10.0 + XID_HOLD_SECONDS + 1, "xid") == WARNING


def test_the_failure_wins_whichever_xid_came_first() -> None:
    tracker = HealthTracker()
    _level(tracker, _xids(x63=0, x79=0), 0.0, "xid")
    assert _level(tracker, _xids(x63=1, x79=0), 10.0, "xid") == WARNING
    assert _level(tracker, _xids(x63=1, x79=1), 20.0, "xid") == FAILURE
    assert _level(tracker, _xids(x63=2, x79=1), 30.0, "xid") == FAILURE


def test_an_xid_that_happens_again_holds_its_level_for_an_hour_from_the_last_time() -> None:
    tracker = HealthTracker()
    _level(tracker, _xids(x79=0), 0.0, "xid")
    assert _level(tracker, _xids(x79=1), 10.0, "xid") == FAILURE
    assert _level(tracker, _xids(x79=2), 3000.0, "xid") == FAILURE  # again, 50 minutes later
    assert _level(tracker, _xids(x79=2), 10.0 + XID_HOLD_SECONDS + 60, "xid") == FAILURE  # an hour after the first
    assert _level(tracker, _xids(x79=2), 3000.0 + XID_HOLD_SECONDS + 1, "xid") == OK  # an hour after the last


def test_a_pcie_replay_counter_that_resets_is_not_a_burst_of_replays() -> None:
    """A driver reload zeroes NVML's counters: a drop is a reset, not millions of replays a minute."""
    tracker = HealthTracker()
    for t, count in ((0.0, 5_000_000.0), (30.0, 5_000_001.0)):
        assert _level(tracker, {("pcie_replay", ()): count}, t, "pcie") == OK
    assert _level(tracker, {("pcie_replay", ()): 0.0}, 60.0, "pcie") == OK
    assert _level(tracker, {("pcie_replay", ()): 2.0}, 90.0, "pcie") == OK


def test_memory_fails_at_exactly_the_retired_page_limit() -> None:
    tracker = HealthTracker()
    below = {("retired_pages_sbe", ()): float(RETIRED_PAGES_FAILURE - 1), ("retired_pages_dbe", ()): 0.0}
    at = {("retired_pages_sbe", ()): float(RETIRED_PAGES_FAILURE - 1), ("retired_pages_dbe", ()): 1.0}
    assert _level(tracker, below, 0.0, "memory") == OK
    assert _level(tracker, at, 1.0, "memory") == FAILURE  # out of spare pages (and a DBE page: warning at least)
