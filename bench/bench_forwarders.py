"""The exporter's forwarder against vmagent and Prometheus's agent, behind the same thin link, in real time.

    python bench/bench_forwarders.py                                       # 4 rates x 6 forwarders, 10 min each
    python bench/bench_forwarders.py --rates unthrottled,150 --minutes 4 --parallel
    python bench/bench_forwarders.py --rates unthrottled --minutes 16 --outage-minutes 10 --parallel
    python bench/bench_forwarders.py --forwarders ours-10s,vmagent-best --rates 500 --repeat 3

Each forwarder at each rate is one edge node of its own: the exporter CLI on 8 simulated GPUs read every
second, in a network namespace whose WAN (one veth pair) is shaped by ``tc tbf`` each way at that rate,
one 1600-byte frame of burst, every frame counted with its headers (tests/support/netns.py, as
bench/bench_weak_link.py does). The bucket is the namespace's link itself, so every connection of a
forwarder shares it: a peer with several connections gets no more than the link. Nothing is scaled: a
real kernel link at its real rate, in real time; only the GPUs are simulated.

- ``ours-2m``, ``ours-10s``: the exporter forwards over MQTT (default 2 min batches, or 10 s) to a real
  Mosquitto on this host; the real bridge writes into the cloud TSDB (tests/support/weak_link_rig.py).
- ``vmagent``, ``prometheus`` and their ``-best``: the peer in the namespace scrapes the exporter every
  second and remote-writes through the WAN (bench/forwarder_peers.py, which documents the settings).

The cloud TSDB is one real VictoriaMetrics on 127.0.0.1 shared by every node. Every ``--poll`` seconds
it reads the age of the stalest GPU's newest temperature (raw or a summary's ``_last``). At the end: the
bytes the edge sent on the WAN (the veth's own counter), per GPU-sample the exporter read and per
GPU-sample the cloud holds at full resolution; the GPU-samples (from 20 s after the start) stored raw,
still behind (newer than each GPU's newest stored one) and lost (holes before it); the node's series.
With ``--outage-minutes``, the link goes down (the veth's edge end, a pulled cable) at
``--outage-at`` and comes back: the seconds until the lag is back within 10 s of its median before.
Rows are medians where ``--repeat`` ran several; runs are interleaved (or all at once with --parallel).
The machine's load average is printed, since every figure depends on it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "bench")]

from tests.support.netns import netns_unavailable  # noqa: E402
from tests.support.tsdb import VictoriaMetricsServer, http_get  # noqa: E402
from tests.support.weak_link_rig import Rig, run_together  # noqa: E402

from forwarder_peers import CloudTSDB, PeerRig  # noqa: E402
from forwarder_table import (  # noqa: E402
    Result,
    account,
    caught_up_after,
    from_json,
    parse_forwarders,
    parse_rates,
    rate_name,
    table,
)

STOP = threading.Event()  # set by SIGTERM: every run ends and cleans up (processes, namespaces)
GPUS = 8
WARMUP = 20.0  # seconds after the start not counted in the accounting (first scrape, first connection)
LOADS: list[float] = []  # the 1-minute load average, read at every poll of every run


def _stored(tsdb: VictoriaMetricsServer, node: str) -> tuple[dict[str, list[float]], int, int]:
    """Per GPU, the raw temperature timestamps (s) the cloud holds; its summary points; the node's series."""
    raw: dict[str, list[float]] = {}
    for key, points in tsdb.samples(f'gpu_temperature_celsius{{node="{node}",sensor="gpu"}}', "3h").items():
        raw.setdefault(dict(key).get("gpu", ""), []).extend(t / 1000 for t, _ in points)
    summaries = sum(len(p) for p in tsdb.samples(f'gpu_temperature_celsius_last{{node="{node}"}}', "3h").values())
    params = urllib.parse.urlencode({"match[]": f'{{node="{node}"}}', "start": f"{time.time() - 3 * 3600:.0f}"})
    series = len(json.loads(http_get(f"{tsdb.url}/api/v1/series?{params}", 30.0))["data"])
    return raw, summaries, series


def run_one(
    forwarder: str, rate: float, run: int, args: argparse.Namespace, tsdb: VictoriaMetricsServer, work: Path
) -> Result:
    name = f"f{os.getpid() % 1000}{forwarder[0]}{forwarder[-1]}{len(forwarder)}r{rate:.0f}n{run}"
    where = work / name
    rig: Rig | PeerRig
    if forwarder.startswith("ours"):
        interval = forwarder.split("-", 1)[1]
        rig = Rig(name, rate, where, tsdb, agent_extra=(f"--mqtt.batch-interval={interval}",))
    else:
        rig = PeerRig(name, forwarder, rate, where, tsdb)
    lags: list[tuple[float, float]] = []
    cut_at = args.outage_at * 60 if args.outage_minutes > 0 else math.inf
    back_at = cut_at + args.outage_minutes * 60
    restored = math.nan
    try:
        rig.start()
        assert rig.link is not None and rig.probe is not None
        wall0 = time.time()
        end = rig.started + args.minutes * 60
        cut = False
        while (now := time.monotonic()) < end and not STOP.is_set():
            t = now - rig.started
            if not cut and cut_at <= t < back_at:
                rig.link.cut()
                cut = True
            elif cut and t >= back_at:
                rig.link.restore()
                cut, restored = False, t
            try:
                lag = rig.probe.lag()[0]
            except OSError:
                lag = math.nan
            lags.append((t, lag))
            LOADS.append(os.getloadavg()[0])
            with open(where / "lag.tsv", "a") as readings:
                readings.write(f"{t:.1f}\t{lag:.1f}\n")
            STOP.wait(max(0.0, args.poll - (time.monotonic() - now)))
        if cut:
            rig.link.restore()
        seconds = time.monotonic() - rig.started
        wall1 = time.time()
        uplink = rig.link.uplink_bytes()
        raw, summaries, series = _stored(tsdb, rig.node)
        payload = 0
        if isinstance(rig, Rig) and rig.agent is not None:
            payload = round(rig.agent.metrics().get("gpu_exporter_forward_published_bytes_total", 0.0))
    finally:
        rig.stop()
    result = Result(
        forwarder=forwarder,
        rate=rate,
        seconds=seconds,
        gpus=GPUS,
        uplink_bytes=uplink,
        stored_all=sum(len({round(t, 1) for t in ts}) for ts in raw.values()),
        accounting=account(raw, GPUS, wall0 + WARMUP, wall1, 1.0),
        series=series,
        summary_points=summaries,
        payload_bytes=payload,
        minutes=args.minutes,
        lag=lags,
    )
    if not math.isnan(restored):
        before = [lag for t, lag in lags if 60 <= t < cut_at] or [lag for t, lag in lags if t < cut_at]
        result.caught_up = caught_up_after(lags, restored, before)
    return result


def _options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--rates", default="unthrottled,2k,500,150", help="bytes per second, comma-separated (%(default)s)"
    )
    parser.add_argument("--forwarders", default="all", help="comma-separated, or all (%(default)s)")
    parser.add_argument("--minutes", type=float, default=10.0, help="real-time length of each run (%(default)s)")
    parser.add_argument("--outage-minutes", type=float, default=0.0, help="the link down this long (%(default)s: none)")
    parser.add_argument("--outage-at", type=float, default=2.0, help="minutes into the run it goes down (%(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each forwarder and rate (%(default)s)")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between TSDB reads (%(default)s)")
    parser.add_argument("--parallel", action="store_true", help="every run at once, each in its own namespace")
    parser.add_argument("--keep", type=Path, help="keep the logs, every lag reading and results.json here")
    parser.add_argument(
        "--table", type=Path, nargs="+", metavar="RESULTS", help="run nothing: the table of kept results.json files"
    )
    return parser


def main() -> int:
    parser = _options()
    args = parser.parse_args()
    try:
        rates = parse_rates(args.rates)
        forwarders = parse_forwarders(args.forwarders)
        if args.minutes <= 0 or args.poll <= 0 or args.repeat < 1:
            raise ValueError("--minutes and --poll must be positive, --repeat at least 1")
        if args.outage_minutes > 0 and args.outage_at + args.outage_minutes >= args.minutes:
            raise ValueError("--minutes must outlast --outage-at + --outage-minutes (time to catch up)")
    except ValueError as exc:
        print(f"bench_forwarders: {exc}", file=sys.stderr)
        return 2

    def stop(*_: object) -> None:  # a stop runs the clean-up: processes, namespaces (each run's own thread too)
        STOP.set()
        sys.exit(1)

    if args.table:
        try:
            kept = [r for path in args.table for r in from_json(json.loads(path.read_text()))]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"bench_forwarders: --table: {exc}", file=sys.stderr)
            return 2
        print(table(kept, max((r.planned_minutes for r in kept), default=1.0)))
        return 0
    signal.signal(signal.SIGTERM, stop)
    why = netns_unavailable()
    if why:
        print(f"bench_forwarders: {why}", file=sys.stderr)
        return 2
    plan = [(f, r, n) for n in range(args.repeat) for r in rates for f in forwarders]
    outage = (
        f", the link down {args.outage_minutes:g} min from minute {args.outage_at:g}" if args.outage_minutes else ""
    )
    print(f"# bench_forwarders: {', '.join(forwarders)} at {', '.join(rate_name(r) for r in rates)}")
    print(f"# {len(plan)} runs of {args.minutes:g} min{outage}, {'all at once' if args.parallel else 'one at a time'}")
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)", flush=True)
    results: list[Result] = []
    failed: list[str] = []

    def one(f: str, r: float, n: int) -> None:
        try:
            results.append(run_one(f, r, n, args, tsdb, work))
        except Exception as exc:  # a run that fails is reported and the others go on
            failed.append(f"{f} at {rate_name(r)} (run {n + 1}): {exc}"[:500])

    with tempfile.TemporaryDirectory(prefix="bench-fwd-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        tsdb = CloudTSDB(work / "vm")
        tsdb.start()
        try:
            if args.parallel:
                threads = [threading.Thread(target=one, args=item) for item in plan]
                run_together(threads, STOP)
            else:
                for item in plan:
                    one(*item)
                    print(f"  done: {item[0]} at {rate_name(item[1])}", flush=True)
        finally:
            tsdb.stop()
        if args.keep is not None:
            (work / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print()
    print(table(results, args.minutes))
    for line in failed:
        print(f"failed: {line}")
    if LOADS:
        print(
            f"\nload average (1 min) during the runs: median {statistics.median(LOADS):.2f}, "
            f"max {max(LOADS):.2f}; at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
