"""The fleet bench's results: one run's figures (``Result``), the median of several, and the table
bench_fleet.py prints; the machine's load and cores, printed with them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

__all__ = ["Result", "cores", "loadavg", "median_result", "print_table", "quantile"]


@dataclass
class Result:
    label: str
    nodes: int
    bridges: int
    offered: float  # GPU-samples/s
    per_cpu: float = 0.0  # GPU-samples per bridge CPU-second, in the window
    rss_steady: float = 0.0  # MB, median over the window, largest bridge
    rss_peak: float = 0.0  # MB, VmHWM, largest bridge
    lag_p50: float = float("nan")
    lag_p99: float = float("nan")
    lag_n: int = 0
    writes: float = 0.0  # remote-write requests in the window
    messages: float = 0.0  # messages the bridges received in the window
    lost: int = 0
    duplicated: int = 0
    nodes_lost: int = 0
    nodes_dup: int = 0
    rows_expected: int = 0
    rows_stored: float = 0.0
    busy: float = 0.0  # machine CPU busy, fraction of all cores, in the window
    ours: float = 0.0  # of which: this bench's processes (publisher, Mosquitto, VictoriaMetrics, bridges)
    first_share: float = 0.0  # messages in the window from nodes not heard before it
    shares: list[float] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)
    runs: list[float] = field(default_factory=list)  # GPU-samples per CPU-s of every run, when several


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def cores() -> int:
    return os.cpu_count() or 1


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def print_table(results: list[Result], header: str) -> None:
    print(header)
    print(
        "| bridge | nodes | bridges | offered GPU-samples/s | GPU-samples per bridge CPU-s (vs first) "
        "| bridge RSS steady / peak MB | lag p50 / p99 s (probes) | remote writes (messages) "
        "| lost / duplicated (nodes) | machine busy (ours) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    first: dict[int, float] = {}
    for r in results:
        base = first.setdefault(r.nodes, r.per_cpu)
        print(
            f"| {r.label} | {r.nodes:,} | {r.bridges} | {r.offered:,.0f} | {r.per_cpu:,.0f} "
            f"({r.per_cpu / base if base else 0:.2f}x) | {r.rss_steady:.0f} / {r.rss_peak:.0f} "
            f"| {r.lag_p50:.1f} / {r.lag_p99:.1f} ({r.lag_n}) | {r.writes:,.0f} ({r.messages:,.0f}) "
            f"| {r.lost} / {r.duplicated} ({r.nodes_lost} / {r.nodes_dup}) | {r.busy:.0%} ({r.ours:.0%}) |"
        )
        notes = [f"{k}: {v}" for k, v in r.extra.items()]
        if r.shares:
            notes.append("share of samples written per bridge: " + " / ".join(f"{s:.1%}" for s in r.shares))
        if r.first_share:
            notes.append(f"{r.first_share:.0%} of the window's batches were a node's first")
        if r.rows_expected:
            notes.append(f"rows stored {r.rows_stored:,.0f} of {r.rows_expected:,} published")
        if r.runs:
            notes.append("runs (GPU-samples per bridge CPU-s): " + ", ".join(f"{x:,.0f}" for x in r.runs))
        for n in notes:
            print(f"    {n}")


def median_result(runs: list[Result]) -> Result:
    """The run with the median GPU-samples per CPU-second (its other figures as measured)."""
    best = sorted(runs, key=lambda r: r.per_cpu)[len(runs) // 2]
    if len(runs) > 1:
        best.runs = [r.per_cpu for r in runs]
    return best
