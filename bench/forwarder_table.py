"""The pure parts of bench/bench_forwarders.py: its options' values, what a run's stored samples say
(stored at full resolution, still behind, lost), the time to catch up after an outage, and the table.

Nothing here starts a process or reads a clock, so tests/unit/bench/test_bench_forwarders.py checks it
with made-up readings.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FORWARDERS",
    "Accounting",
    "Result",
    "account",
    "caught_up_after",
    "from_json",
    "parse_forwarders",
    "parse_rates",
    "rate_name",
    "table",
]

# Every forwarder the bench knows, in the table's order: the exporter's own (MQTT, the bridge into the
# TSDB) at its default 2 min batches and at 10 s batches; vmagent and Prometheus's agent at their remote
# write defaults and at the settings that suit a thin link best (bench/forwarder_peers.py says which).
FORWARDERS = ("ours-2m", "ours-10s", "vmagent", "vmagent-best", "prometheus", "prometheus-best")


def parse_rates(text: str) -> list[float]:
    """``unthrottled,2k,500,150`` -> [0, 2000, 500, 150] (bytes per second; 0 is an unthrottled link)."""
    rates: list[float] = []
    for item in (t.strip().lower() for t in text.split(",")):
        if not item:
            continue
        if item in ("unthrottled", "0", "none"):
            rates.append(0.0)
            continue
        scale = 1000.0 if item.endswith("k") else 1.0
        try:
            rate = float(item.removesuffix("k")) * scale
        except ValueError:
            raise ValueError(f"--rates: {item!r} is not a rate (bytes per second: 150, 2k, or unthrottled)") from None
        if not math.isfinite(rate) or rate < 8:
            raise ValueError(f"--rates: {item!r} is not a rate a link can have (at least 8 bytes per second)")
        rates.append(rate)
    if not rates:
        raise ValueError("--rates: no rate given")
    return rates


def parse_forwarders(text: str) -> list[str]:
    """``ours-10s,vmagent`` -> the names, checked; ``all`` is every one."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if names == ["all"]:
        return list(FORWARDERS)
    unknown = [n for n in names if n not in FORWARDERS]
    if unknown or not names:
        raise ValueError(f"--forwarders: {', '.join(unknown) or 'none given'}; known: all, {', '.join(FORWARDERS)}")
    return names


def rate_name(rate: float) -> str:
    return "unthrottled" if rate <= 0 else (f"{rate / 1000:g} kB/s" if rate >= 1000 else f"{rate:g} B/s")


@dataclass(frozen=True)
class Accounting:
    """GPU-samples (one GPU's reading at one instant) of a window, as the cloud holds them at the end."""

    expected: int  # GPUs x window / interval: what the exporter read
    stored: int  # raw, at full resolution
    behind: int  # newer than each GPU's newest stored one: on its way, or never coming
    lost: int  # holes before each GPU's newest stored one


def account(
    timestamps: Mapping[str, Sequence[float]], gpus: int, start: float, end: float, interval: float
) -> Accounting:
    """From each GPU's stored raw timestamps (seconds), what happened to the window [start, end): what is
    missing before the newest stored sample is lost, what is newer than it is behind. Counted from the
    span, so a reading a little early or late (a scrape's jitter) is no hole."""
    stored = behind = lost = 0
    for gpu in range(gpus):
        inside = sorted({round(t, 1) for t in timestamps.get(str(gpu), ()) if start <= t < end})
        if not inside:
            behind += math.floor((end - start) / interval)
            continue
        first, newest = inside[0], inside[-1]
        stored += len(inside)
        lost += max(0, round((newest - first) / interval) + 1 - len(inside))
        lost += max(0, round((first - start) / interval) - 1)
        behind += max(0, math.ceil((end - newest) / interval) - 1)
    return Accounting(gpus * round((end - start) / interval), stored, behind, lost)


def caught_up_after(readings: Iterable[tuple[float, float]], restored: float, before: Sequence[float]) -> float:
    """Seconds from the link's return until the cloud's lag is back within 10 s of its median before the
    outage (``before``); inf if it never was while the run lasted. ``readings``: (time, lag) pairs."""
    finite = [b for b in before if math.isfinite(b)]
    bound = (statistics.median(finite) if finite else 0.0) + 10.0
    for t, lag in readings:
        if t >= restored and lag <= bound:
            return t - restored
    return math.inf


@dataclass
class Result:
    """One forwarder's run at one rate."""

    forwarder: str
    rate: float
    seconds: float  # how long the run lasted, from the forwarder's start
    gpus: int
    uplink_bytes: int  # every frame the edge sent on the WAN, headers included
    stored_all: int  # raw GPU-samples the cloud holds from the whole run
    accounting: Accounting
    series: int  # series of the node the cloud holds (the same data for every forwarder?)
    summary_points: int = 0  # the exporter's summaries (not full resolution), for ours on a thin link
    payload_bytes: int = 0  # for ours, the MQTT payloads it published (the rest of the uplink: MQTT, TCP, IP)
    lag: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, lag of the stalest GPU)
    caught_up: float = math.nan  # seconds after the outage; nan: no outage in the run
    minutes: float = 0.0  # the run's planned length (--minutes); 0: the measured one, rounded

    @property
    def planned_minutes(self) -> float:
        return self.minutes or float(round(self.seconds / 60))

    @property
    def bytes_per_second(self) -> float:
        return self.uplink_bytes / self.seconds if self.seconds else math.nan

    @property
    def per_sample_read(self) -> float:
        """Uplink bytes per GPU-sample the exporter read in the run."""
        return self.uplink_bytes / (self.gpus * self.seconds) if self.seconds else math.nan

    @property
    def per_sample_stored(self) -> float:
        """Uplink bytes per GPU-sample the cloud holds at full resolution."""
        return self.uplink_bytes / self.stored_all if self.stored_all else math.nan

    def lag_max(self, first: float, last: float = math.inf) -> float:
        """The worst lag read in [first, last) seconds since the start."""
        inside = [lag for t, lag in self.lag if first <= t < last and not math.isnan(lag)]
        return max(inside) if inside else math.nan


def from_json(items: Iterable[dict[str, Any]]) -> list[Result]:
    """Results as ``--keep`` wrote them (results.json), to print one table of several runs' files."""
    out = []
    for item in items:
        fields = dict(item)
        fields["accounting"] = Accounting(**fields["accounting"])
        fields["lag"] = [(float(t), float(v)) for t, v in fields.get("lag", [])]
        out.append(Result(**fields))
    return out


def _median(values: Iterable[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


def _num(v: float, unit: str = "", infinite: str = "none yet") -> str:
    if math.isnan(v):
        return "-"
    if math.isinf(v):
        return infinite
    return f"{v:,.0f}{unit}" if abs(v) >= 10 or v == 0 else f"{v:.1f}{unit}"


def table(results: Sequence[Result], minutes: float) -> str:
    """One row per forwarder and rate, medians where several runs; a lag row per minute below."""
    groups: dict[tuple[float, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.rate, r.forwarder), []).append(r)
    # unthrottled first, then the rates from the widest; the forwarders in FORWARDERS' order
    order = sorted(groups, key=lambda k: (k[0] > 0, -k[0], FORWARDERS.index(k[1]) if k[1] in FORWARDERS else 99))
    outage = any(not math.isnan(r.caught_up) for r in results)
    head = [
        "forwarder",
        "link",
        "runs",
        "uplink B/s",
        "B per GPU-sample read",
        "B per GPU-sample stored",
        "stored at full resolution",
        "behind at the end",
        "lost",
        "series",
        "lag max, minute 2",
        "lag max, last minute",
        "lag max from minute 2",
    ] + (["caught up after the outage"] if outage else [])
    summaries = any(r.summary_points for r in results)
    if summaries:
        head.insert(9, "summary points")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in order:
        runs = groups[key]
        expected = _median(r.accounting.expected for r in runs)
        stored = _median(r.accounting.stored for r in runs)
        row = [
            key[1],
            rate_name(key[0]),
            str(len(runs)),
            _num(_median(r.bytes_per_second for r in runs)),
            _num(_median(r.per_sample_read for r in runs)),
            _num(_median(r.per_sample_stored for r in runs)),
            f"{_num(stored)} of {_num(expected)} ({100 * stored / expected:.0f} %)" if expected else "-",
            _num(_median(r.accounting.behind for r in runs)),
            _num(_median(r.accounting.lost for r in runs)),
            *([_num(_median(r.summary_points for r in runs))] if summaries else []),
            _num(_median(r.series for r in runs)),
            _num(_median(r.lag_max(60, 120) for r in runs), " s"),
            _num(_median(r.lag_max(max(0.0, minutes * 60 - 60)) for r in runs), " s"),
            _num(_median(r.lag_max(60) for r in runs), " s"),
        ]
        if outage:
            row.append(_num(_median(r.caught_up for r in runs), " s", "never"))
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Lag of the stalest GPU (the worst reading of each minute, s; median of the runs):", ""]
    width = math.ceil(minutes)
    lines.append("| forwarder | link | " + " | ".join(str(m + 1) for m in range(width)) + " |")
    lines.append("|" + "---|" * (width + 2))
    for key in order:
        runs = groups[key]
        cells = [_num(_median(r.lag_max(m * 60, (m + 1) * 60) for r in runs)) for m in range(width)]
        lines.append(f"| {key[1]} | {rate_name(key[0])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
