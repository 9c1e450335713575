"""The fleet bench: N simulated 8-GPU nodes through a real Mosquitto into real bridges and VictoriaMetrics.

Every node has its own MQTT 5 connection and publishes what the agent publishes (fleet_nodes.py,
fleet_wire.py, fleet_payloads.py; tests/unit/bench/test_bench_fleet_wire.py checks the bytes against the agent's own
client and encoder): 24-sample batches of the simulated H100 backend, QoS 1, send-time properties,
retained status; one connection per node, phases spread over the interval. The bridges are `gpu-exporter
bridge` processes (this worktree's by default) with default options; VictoriaMetrics runs without dedup,
so anything written twice is counted.

Scenarios (--scenario):
  steady   (default) one run per --nodes count at the same offered load (--rate GPU-samples/s, or
           --interval seconds between a node's batches); prints per size: offered GPU-samples/s,
           GPU-samples per bridge CPU-second (/proc/<pid>/stat of the bridges, over the measured
           window), bridge RSS (median over the window, and peak VmHWM), publish-to-queryable lag
           (p50/p99 of probe nodes' batches, polled in VictoriaMetrics), remote-write requests, and
           the count check per node (samples in the TSDB against batches the broker acknowledged).
  share    --bridges (2) bridges in one shared-subscription group: each one's share of the samples.
  kill     two bridges in one group; one is SIGKILLed mid-run and restarted (--restart-after s later):
           samples lost and duplicated per node.
  backlog  the broker stops, every node has --backlog (30) batches spooled, the broker restarts and the
           nodes reconnect at once: time until all is in the TSDB, bridge memory throughout.
  rollout  steady, but the fleet connects --settle (15) s after the bridge subscribed, when the fleet's
           introduction (retained status messages right after a start) is over: a DaemonSet rolled out
           onto a running bridge. Its new names are admitted by the bridge's burst; the table's notes
           give the names admitted, batches held back and dropped by admission.

--tsdb sharded writes through vmagent into two VictoriaMetrics shards split by node (bench/fleet_shards.py)
instead of one VictoriaMetrics; the count check reads every shard (a sample in two is a duplicate), and
the notes give each shard's nodes and samples and vmagent's CPU.

The default run (steady, 100/1,000/5,000 nodes, 1,600 GPU-samples/s offered at every size, a warm-up
of one batch interval but at most 150 s, then 60 s measured) takes about 15 minutes on an idle 2-core
machine; --duration, --warmup and --runs make it longer. A 5,000-node fleet at 1,600 GPU-samples/s
sends one batch per node every 10 minutes: only --warmup 600 measures it with every node seen before
the window (the table says which share of the window's batches were a node's first). CPU per sample
is what to compare; lag is wall-clock and follows the machine's load (printed with each run). Compare
bridge versions in one invocation, interleaved, with --bridge-src (e.g. `git archive <commit> src`).
bench/fleet_scaling.py times the bridge's own code by node count without broker, TSDB or network;
bench/fleet_profile.py reads the py-spy profiles --profile records.

    PYTHONPATH=src python bench/bench_fleet.py [--nodes 100,1000,5000] [--rate 1600 | --interval 120]
        [--duration 60] [--warmup S] [--runs 1] [--scenario steady|share|kill|backlog]
        [--bridge-src base=/tmp/base/src --bridge-src 'new=src;--bridge.write-linger=1s']
        [--bridge-arg=--bridge.series-cache=3000000 ...] [--profile DIR [--profile-mode cpu|wall]]
        [--tsdb single|sharded]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import fleet_procs as procs
from fleet_checks import Prober, count_check
from fleet_nodes import Fleet, FleetSettings, raise_nofile
from fleet_payloads import Templates
from fleet_profile import start_profilers
from fleet_report import Result, cores, loadavg, median_result, print_table, quantile
from fleet_shards import Sharded, split_note
from gpu_exporter.bridge.cli import tune_gc
from gpu_exporter.bridge.options import BridgeOptions

GPUS = 8
PER_BATCH = 24  # the agent's default: --mqtt.batch-interval 120 s at --interval 5 s
AGENT_INTERVAL = 120.0


# ------------------------------------------------------------------------------------------ lag probes


# ------------------------------------------------------------------------------------------------ runs


class Stack:
    """Mosquitto, VictoriaMetrics and the bridges of one run; everything stopped by PID on exit."""

    def __init__(
        self, workdir: Path, bridges: int, group: str, bridge_args: list[str], src: Path, tsdb: str = "single"
    ) -> None:
        self.workdir = workdir
        self.src = src
        self.broker = procs.Mosquitto(workdir)
        self.vm: procs.Victoria | Sharded = procs.Victoria(workdir) if tsdb == "single" else Sharded(workdir / "tsdb")
        # names of the TSDB's processes in the sampler: the one VictoriaMetrics, or the shards and vmagent
        self.tsdb_names: list[str] = []
        self.sampler = procs.ProcSampler()
        self.bridge_args = bridge_args
        self.group = group
        self.bridges = [self._bridge(i) for i in range(bridges)]
        self.incarnations: Counter[int] = Counter()

    def _bridge(self, i: int) -> procs.Bridge:
        return procs.Bridge(
            self.workdir,
            i,
            f"mqtt://127.0.0.1:{self.broker.port}",
            self.vm.write_url,
            self.group,
            self.bridge_args,
            self.src,
        )

    def __enter__(self) -> Stack:
        try:
            self.broker.start()
            self.vm.start()
            self.sampler.watch("mosquitto", self.broker.pid)
            tsdb = self.vm.watched() if isinstance(self.vm, Sharded) else [("victoria", self.vm.pid)]
            for name, pid in tsdb:
                self.sampler.watch(name, pid)
            self.tsdb_names = [name for name, _ in tsdb]
            self.sampler.watch("bench", os.getpid())
            for i in range(len(self.bridges)):
                self.start_bridge(i)
            self.sampler.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def bridge_name(self, i: int) -> str:
        return f"bridge-{i}.{self.incarnations[i]}"

    def start_bridge(self, i: int) -> None:
        b = self.bridges[i]
        b.start()
        self.incarnations[i] += 1
        self.sampler.watch(self.bridge_name(i), b.pid)

    def kill_bridge(self, i: int) -> None:
        self.sampler.sample_one(self.bridge_name(i), self.bridges[i].pid)
        self.sampler.forget(self.bridge_name(i))
        self.bridges[i].kill()
        self.bridges[i] = self._bridge(i)  # the same client id, a fresh metrics port

    def bridge_metrics(self) -> list[dict[str, float]]:
        return [b.metrics() if b.proc is not None else {} for b in self.bridges]

    def __exit__(self, *exc: object) -> None:
        self.sampler.stop()
        for b in self.bridges:
            b.stop()
        self.vm.stop()
        self.broker.stop()


def _sum(ms: list[dict[str, float]], name: str) -> float:
    return sum(m.get(name, 0.0) for m in ms)


async def _wait_written(stack: Stack, rows_target: float, timeout: float) -> bool:
    """Until VictoriaMetrics took ``rows_target`` rows and the live bridges' queues are empty, or the
    rows stopped growing for 20 s with empty queues (something was lost), or ``timeout``."""
    deadline = time.monotonic() + timeout
    last, still = -1.0, time.monotonic()
    while time.monotonic() < deadline:
        rows = await asyncio.to_thread(stack.vm.metric, "vm_rows_inserted_total")
        queues = _sum(await asyncio.to_thread(stack.bridge_metrics), "gpu_exporter_bridge_queue_messages")
        if rows >= rows_target and not queues:
            return True
        if rows != last:
            last, still = rows, time.monotonic()
        elif not queues and time.monotonic() - still > 20:
            return False
        await asyncio.sleep(2)
    return False


def fleet_args(nodes: int, scenario: str = "steady") -> list[str]:
    """The option an operator of a fleet this size sets (docs/bridge.md, Sizing): a fleet-wide series
    budget for every node (an 8-GPU node is 848 series here, 888 with the agent's health reports), which
    also sizes the burst of new node names admitted at once (--bridge.new-nodes-burst, by default one per
    100 series); none while the default covers the fleet. A rollout runs with the default options only:
    what it tests is that they admit a large DaemonSet rollout. A later --bridge-arg overrides it."""
    if scenario == "rollout" or nodes * 1000 <= BridgeOptions.bridge_max_series:
        return []
    return [f"--bridge.max-series={nodes * 1000}"]


async def steady(
    args: argparse.Namespace,
    nodes: int,
    bridges: int,
    scenario: str,
    workdir: Path,
    variant: tuple[str, Path, list[str]],
) -> Result:
    interval = args.interval or nodes * GPUS * PER_BATCH / args.rate
    offered = nodes * GPUS * PER_BATCH / interval
    group = "fleet" if bridges > 1 or scenario != "steady" else ""
    templates = Templates(GPUS, PER_BATCH, spacing=interval / PER_BATCH)
    res = Result(variant[0], nodes, bridges, offered)
    bridge_args = fleet_args(nodes, scenario) + args.bridge_arg + variant[2]
    with Stack(workdir, bridges, group, bridge_args, variant[1], args.tsdb) as stack:
        settings = FleetSettings("127.0.0.1", stack.broker.port, nodes, interval)
        if scenario == "rollout":  # onto a running bridge, its fleet's introduction over
            await asyncio.sleep(args.settle)
        step = max(1, nodes // args.probes)
        prober = Prober(stack.vm, set(range(0, nodes, step)))
        fleet = Fleet(settings, templates, on_ack=prober.acked)
        fleet.start()
        connected = await fleet.wait_connected(120)
        if connected < nodes:
            raise SystemExit(f"only {connected} of {nodes} nodes connected")
        publishing = asyncio.ensure_future(fleet.publish_for(args.warmup + args.duration))
        await asyncio.sleep(args.warmup)
        heard = {n.index for n in fleet.nodes if n.next_seq > 1}
        published_before = fleet.published
        t0 = time.monotonic()
        m0 = await asyncio.to_thread(stack.bridge_metrics)
        profilers = start_profilers(args, [b.pid for b in stack.bridges], nodes)
        killed_at = None
        if scenario == "kill":
            await asyncio.sleep(args.duration / 2)
            stack.kill_bridge(0)
            killed_at = time.monotonic() - t0
            await asyncio.sleep(args.restart_after)
            await asyncio.to_thread(stack.start_bridge, 0)
        await publishing
        t1 = time.monotonic()
        m1 = await asyncio.to_thread(stack.bridge_metrics)
        for p in profilers:
            p.wait()
        in_window = fleet.published - published_before
        firsts = sum(1 for n in fleet.nodes if n.index not in heard and n.next_seq > 1)
        res.first_share = firsts / in_window if in_window else 0.0
        if not await fleet.drain(300):
            res.extra["unacked"] = str(fleet.pending())
        acked = [a for n in fleet.nodes for a in n.acked]
        res.rows_expected = sum(a.message.rw_samples for a in acked)
        rows_base = 0.0  # VictoriaMetrics is fresh for each run
        done = await _wait_written(stack, rows_base + res.rows_expected, args.drain_timeout)
        if not done:
            res.extra["drain"] = "timed out or stalled"
        await asyncio.sleep(2)  # the last rows become searchable
        prober.stop()
        res.rows_stored = stack.vm.metric("vm_rows_inserted_total")
        res.lost, res.duplicated, res.nodes_lost, res.nodes_dup = count_check(stack.vm, fleet)
        if isinstance(stack.vm, Sharded):
            first = min((t for n in fleet.nodes for a in n.acked for t in a.message.times_ms), default=0)
            res.extra["shards"] = split_note(stack.vm, first - 1000)
        await fleet.close()
        if scenario == "rollout":
            end = await asyncio.to_thread(stack.bridge_metrics)
            res.extra["admission"] = (
                f"{_sum(end, 'gpu_exporter_bridge_new_nodes_total'):,.0f} names admitted, "
                f"{_sum(end, 'gpu_exporter_bridge_held_back_total'):,.0f} batches held back, "
                f"{_sum(end, 'gpu_exporter_bridge_new_nodes_refused_total'):,.0f} dropped by admission, "
                f"{_sum(end, 'gpu_exporter_bridge_series_limited_total'):,.0f} values refused by series limits"
            )

        names = [stack.bridge_name(i) for i in range(bridges)]
        cpu = sum(stack.sampler.cpu_between(n, t0, t1) for n in names)
        if scenario == "kill":
            cpu += stack.sampler.cpu_between("bridge-0.1", t0, t1)
        written = _sum(m1, "gpu_exporter_bridge_gpu_samples_written_total") - _sum(
            m0, "gpu_exporter_bridge_gpu_samples_written_total"
        )
        rows = _sum(m1, "gpu_exporter_bridge_samples_written_total") - _sum(
            m0, "gpu_exporter_bridge_samples_written_total"
        )
        msgs = _sum(m1, "gpu_exporter_bridge_messages_received_total") - _sum(
            m0, "gpu_exporter_bridge_messages_received_total"
        )
        if scenario != "kill" and rows and msgs:  # what the broker and the TSDB cost, for sizing them
            vm_cpu = sum(stack.sampler.cpu_between(n, t0, t1) for n in stack.tsdb_names if n != "vmagent")
            mq_cpu = stack.sampler.cpu_between("mosquitto", t0, t1)
            res.extra["TSDB and broker CPU"] = (
                f"VictoriaMetrics {vm_cpu / rows * 1e6:.2f} CPU-s per million samples written; Mosquitto "
                f"{mq_cpu / msgs * 1e3:.2f} CPU-s per 1,000 batch messages (with {nodes:,} connections)"
            )
            if "vmagent" in stack.tsdb_names:
                agent_cpu = stack.sampler.cpu_between("vmagent", t0, t1)
                res.extra["TSDB and broker CPU"] += (
                    f"; vmagent {agent_cpu / rows * 1e6:.2f} CPU-s per million samples (VictoriaMetrics: both shards)"
                )
        if scenario != "kill":
            res.per_cpu = written / cpu if cpu else 0.0
            res.writes = _sum(m1, "gpu_exporter_bridge_write_requests_total") - _sum(
                m0, "gpu_exporter_bridge_write_requests_total"
            )
            res.messages = _sum(m1, "gpu_exporter_bridge_messages_received_total") - _sum(
                m0, "gpu_exporter_bridge_messages_received_total"
            )
            shares = [
                a.get("gpu_exporter_bridge_gpu_samples_written_total", 0.0)
                - b.get("gpu_exporter_bridge_gpu_samples_written_total", 0.0)
                for a, b in zip(m1, m0, strict=True)
            ]
            res.shares = [s / sum(shares) for s in shares] if sum(shares) else []
            if bridges > 1:
                res.extra["messages received per bridge (whole run)"] = " / ".join(
                    f"{m.get('gpu_exporter_bridge_messages_received_total', 0):,.0f}" for m in m1
                )
        for n in names:
            rs = [r for r in stack.sampler.readings.get(n, []) if t0 <= r.t <= t1]
            if rs:
                res.rss_steady = max(res.rss_steady, statistics.median(r.rss for r in rs) / 1e6)
            allr = stack.sampler.readings.get(n, [])
            if allr:
                res.rss_peak = max(res.rss_peak, max(r.hwm for r in allr) / 1e6)
        lags = [lag for sent, lag in prober.lags]
        res.lag_p50, res.lag_p99, res.lag_n = quantile(lags, 0.5), quantile(lags, 0.99), len(lags)
        res.busy = procs.machine_busy(stack.sampler.busy, t0, t1)
        ours = sum(stack.sampler.cpu_between(n, t0, t1) for n in ("mosquitto", "bench", *stack.tsdb_names)) + cpu
        res.ours = ours / (t1 - t0) / cores()
        if killed_at is not None:
            res.extra["killed"] = (
                f"bridge-0 SIGKILLed {killed_at:.0f} s into the window, restarted {args.restart_after:g} s later"
            )
    return res


async def backlog(
    args: argparse.Namespace, nodes: int, bridges: int, workdir: Path, variant: tuple[str, Path, list[str]]
) -> Result:
    interval = args.interval or AGENT_INTERVAL
    templates = Templates(GPUS, PER_BATCH, spacing=interval / PER_BATCH)
    res = Result(variant[0], nodes, bridges, 0.0)
    bridge_args = fleet_args(nodes) + args.bridge_arg + variant[2]
    with Stack(workdir, bridges, "fleet" if bridges > 1 else "", bridge_args, variant[1], args.tsdb) as stack:
        settings = FleetSettings("127.0.0.1", stack.broker.port, nodes, interval)
        fleet = Fleet(settings, templates)
        fleet.start()
        if await fleet.wait_connected(120) < nodes:
            raise SystemExit("not every node connected")
        stack.broker.stop()
        down = time.monotonic()
        fleet.add_backlog(args.backlog, args.backlog * interval)  # encoded while the broker is down
        await asyncio.sleep(max(0.0, args.outage - (time.monotonic() - down)))
        res.extra["outage"] = f"{time.monotonic() - down:.0f} s"
        res.rows_expected = sum(m.rw_samples for n in fleet.nodes for m in n.backlog)
        res.extra["backlog"] = f"{sum(len(n.backlog) for n in fleet.nodes):,} batches"
        stack.broker.start()
        t0 = time.monotonic()
        stack.sampler.watch("mosquitto", stack.broker.pid)
        acked_at = None
        done = False
        while time.monotonic() - t0 < args.drain_timeout:
            if acked_at is None and not fleet.pending():
                acked_at = time.monotonic() - t0
            rows = await asyncio.to_thread(stack.vm.metric, "vm_rows_inserted_total")
            if rows >= res.rows_expected:
                done = True
                break
            await asyncio.sleep(2)
        t1 = time.monotonic()
        await asyncio.sleep(2)
        res.extra["caught up"] = (
            f"{t1 - t0:.0f} s after the broker restart"
            if done
            else "NOT within --drain-timeout: the count check below was taken while the bridges were still "
            "writing, so its 'lost' are samples not written yet"
        )
        res.extra["acknowledged by the broker"] = f"{acked_at:.0f} s" if acked_at is not None else "not all"
        res.rows_stored = stack.vm.metric("vm_rows_inserted_total")
        res.lost, res.duplicated, res.nodes_lost, res.nodes_dup = count_check(stack.vm, fleet)
        await fleet.close()
        names = [stack.bridge_name(i) for i in range(bridges)]
        cpu = sum(stack.sampler.cpu_between(n, t0, t1) for n in names)
        written = res.rows_expected  # everything was written once, if not lost
        gpu_samples = sum(a.message.gpu_samples for n in fleet.nodes for a in n.acked)
        res.per_cpu = gpu_samples / cpu if cpu else 0.0
        for n in names:
            allr = stack.sampler.readings.get(n, [])
            if allr:
                res.rss_peak = max(res.rss_peak, max(r.hwm for r in allr) / 1e6)
                res.rss_steady = max(res.rss_steady, statistics.median(r.rss for r in allr if t0 <= r.t <= t1) / 1e6)
                peaks = [f"{r.t - t0:.0f}s:{r.rss / 1e6:.0f}" for r in allr[:: max(1, len(allr) // 12)] if r.t >= t0]
                res.extra[f"{n} RSS MB over time"] = " ".join(peaks)
        res.busy = procs.machine_busy(stack.sampler.busy, t0, t1)
        del written
    return res


def variants(specs: list[str]) -> list[tuple[str, Path, list[str]]]:
    """``LABEL=DIR[;--option=value...]``: DIR holds the gpu_exporter package (e.g. an exported src/), the
    options go to that variant's bridges only; in order."""
    out = []
    for spec in specs or [f"this tree={procs.ROOT / 'src'}"]:
        label, sep, rest = spec.partition("=")
        path, *options = rest.split(";")
        if not sep or not (Path(path) / "gpu_exporter").is_dir():
            raise SystemExit(f"--bridge-src {spec!r}: expected LABEL=DIR[;--option=value...] with DIR/gpu_exporter")
        out.append((label, Path(path), options))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("steady", "share", "kill", "backlog", "rollout"), default="steady")
    parser.add_argument("--nodes", default="", help="comma-separated node counts (default per scenario)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=1600.0, help="offered GPU-samples/s (default %(default)s)")
    load.add_argument("--interval", type=float, default=0.0, help="seconds between a node's batches (agent: 120)")
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per run (default %(default)s)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=-1.0,
        help="seconds of publishing before the window (default: one interval, at most 150 s)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs per size; the median is printed")
    parser.add_argument("--bridges", type=int, default=0, help="bridge processes (default: 1, share/kill: 2)")
    parser.add_argument("--bridge-arg", action="append", default=[], help="an extra bridge option (repeatable)")
    parser.add_argument(
        "--bridge-src",
        action="append",
        default=[],
        help="LABEL=DIR[;--option=value...]: run the bridge from DIR (e.g. `git archive` of another commit's src/); repeatable, "
        "runs interleaved, ratios against the first (default: this tree's src/)",
    )
    parser.add_argument(
        "--tsdb",
        choices=("single", "sharded"),
        default="single",
        help="single: one VictoriaMetrics; sharded: vmagent splitting by node across two (bench/fleet_shards.py)",
    )
    parser.add_argument("--probes", type=int, default=40, help="lag probe nodes (default %(default)s)")
    parser.add_argument("--restart-after", type=float, default=5.0, help="kill: seconds before the restart")
    parser.add_argument(
        "--settle", type=float, default=15.0, help="rollout: seconds from the bridge's start to the fleet's"
    )
    parser.add_argument("--backlog", type=int, default=30, help="backlog: batches spooled per node")
    parser.add_argument("--outage", type=float, default=30.0, help="backlog: seconds the broker is down at least")
    parser.add_argument("--drain-timeout", type=float, default=900.0, help="longest wait for the bridges to finish")
    parser.add_argument("--workdir", default="", help="keep each run's logs and data here (default: a temp dir)")
    parser.add_argument("--profile", default="", help="directory for py-spy profiles of the bridges (window)")
    parser.add_argument(
        "--profile-mode",
        choices=("cpu", "wall"),
        default="cpu",
        help="cpu: only stacks holding the GIL (py-spy --gil), wall: idle stacks too (waits on the TSDB)",
    )
    args = parser.parse_args()

    defaults = {"steady": "100,1000,5000", "share": "1000", "kill": "1000", "backlog": "1000", "rollout": "1000"}
    sizes = [int(x.replace("_", "")) for x in (args.nodes or defaults[args.scenario]).split(",")]
    bridges = args.bridges or (2 if args.scenario in ("share", "kill") else 1)
    sources = variants(args.bridge_src)
    raise_nofile(max(sizes) + 1024)
    procs.stop_on_signals()
    tune_gc()  # the publisher allocates like the bridge: few cycles
    before = loadavg()
    results: list[Result] = []
    for nodes in sizes:
        interval = args.interval or nodes * GPUS * PER_BATCH / args.rate
        run_args = argparse.Namespace(**vars(args))
        if args.warmup < 0:
            run_args.warmup = min(interval, 150.0)
        runs: dict[str, list[Result]] = {label: [] for label, _, _ in sources}
        for r in range(args.runs):
            for variant in sources:
                with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
                    name = f"{args.scenario}-{nodes}-{variant[0].replace(' ', '_')}-{r + 1}"
                    where = Path(args.workdir) / name if args.workdir else Path(tmp)
                    if args.scenario == "backlog":
                        res = asyncio.run(backlog(run_args, nodes, bridges, where, variant))
                    else:
                        res = asyncio.run(steady(run_args, nodes, bridges, args.scenario, where, variant))
                runs[variant[0]].append(res)
                print(
                    f"  {variant[0]}, run {r + 1}/{args.runs}, {nodes:,} nodes: {res.per_cpu:,.0f} GPU-samples per "
                    f"bridge CPU-s, RSS {res.rss_steady:.0f}/{res.rss_peak:.0f} MB, lag p50 {res.lag_p50:.1f} s, "
                    f"lost {res.lost}, duplicated {res.duplicated}; load average {loadavg()}",
                    flush=True,
                )
        results += [median_result(v) for v in runs.values()]
    budget = fleet_args(max(sizes), args.scenario)
    extra = (
        "default options"
        + (" and the fleet's --bridge.max-series" if budget else "")
        + "".join(f" {a}" for a in args.bridge_arg)
    )
    target = "VictoriaMetrics" if args.tsdb == "single" else "vmagent -> two VictoriaMetrics shards by node"
    print_table(
        results,
        f"fleet bench, scenario {args.scenario}: simulated 8-GPU nodes (24-sample batches, QoS 1, one MQTT "
        f"connection each) -> Mosquitto -> gpu-exporter bridge ({extra}) -> {target} (no dedup); "
        f"real time, {args.duration:g} s measured after a warm-up, median of {args.runs} run(s); "
        f"load average {before} before, {loadavg()} after, {cores()} cores",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
