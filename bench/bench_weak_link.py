"""The cloud's lag behind an edge node on a thin link, in real time (issue 19).

    python bench/bench_weak_link.py                               # 100, 150, 200, 500, 2000 B/s, 10 min each
    python bench/bench_weak_link.py --rates 150 --minutes 3       # shorter, while developing
    python bench/bench_weak_link.py --parallel                    # every rate at once, each in its own namespace

Each rate is one edge node: the exporter CLI on 8 simulated GPUs read every second, 10 s batches, the
default MQTT keepalive (30 s), in a network namespace whose uplink and downlink are shaped by ``tc tbf``
at that many bytes per second (tests/support/netns.py: one 1600-byte frame of burst, every frame counted with its
headers); a real Mosquitto, the real bridge, and a real VictoriaMetrics shared by all rates. Nothing is
scaled: the link's real rate, real time.

Every ``--poll`` seconds it reads the TSDB: for each GPU the newest timestamp of its temperature, raw or
as a summary's ``_last``. ``all`` is the age of the stalest GPU's newest value (every GPU of the node is
at least that fresh), ``any`` the age of the node's newest value. It prints one table per rate, a row
per minute (max and median of ``all``, max of ``any``), then what the agent says about itself: reconnects
(from the broker's log), batches resent (publish errors) and the bridge's duplicates, the link it
measured, whether it summarised. Also the machine's load average, which the figures depend on.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support.netns import ShapedLink, netns_unavailable  # noqa: E402
from tests.support.procs import stop_process  # noqa: E402
from tests.support.tsdb import VictoriaMetricsServer  # noqa: E402
from tests.support.weak_link_rig import Rig, run_together  # noqa: E402

STOP = threading.Event()  # set by SIGTERM: every rate's run ends and cleans up (processes, namespace)


def run_rate(
    rate: float,
    minutes: float,
    poll: float,
    tsdb: VictoriaMetricsServer,
    work: Path,
    out: dict[float, str],
    extra: tuple[str, ...] = (),
    trace: bool = False,
    burst: int = 0,
) -> None:
    name = f"b{os.getpid() % 1000}r{rate:.0f}"
    tracers: list[_Tracer] = []
    (work / name).mkdir(parents=True, exist_ok=True)
    rig = Rig(
        name,
        rate,
        work / name,
        tsdb,
        agent_extra=extra,
        burst=burst,
        on_link=(lambda link: tracers.append(_Tracer(link, work / name))) if trace else None,
    )
    rows: list[tuple[float, float, float]] = []  # (seconds since start, lag_all, lag_any)
    try:
        rig.start()
        assert rig.agent is not None and rig.probe is not None and rig.broker is not None and rig.link is not None
        cpu0 = _cpu(rig.agent.proc.pid if rig.agent.proc else 0)
        end = rig.started + minutes * 60
        while (now := time.monotonic()) < end and not STOP.is_set():
            try:
                lag_all, lag_any = rig.probe.lag()
            except OSError:
                lag_all = lag_any = math.nan
            rows.append((now - rig.started, lag_all, lag_any))
            with open(work / name / "lag.tsv", "a") as readings:  # every reading, kept with --keep
                readings.write(f"{now - rig.started:.1f}\t{lag_all:.1f}\t{lag_any:.1f}\n")
            STOP.wait(max(0.0, poll - (time.monotonic() - now)))
        metrics = rig.agent.metrics()
        cpu = _cpu(rig.agent.proc.pid if rig.agent.proc else 0) - cpu0
        duplicates = rig.bridge_metric("gpu_exporter_bridge_duplicate_samples_total")
        wire = rig.link.counters()
    finally:
        for tracer in tracers:
            tracer.stop()
        connections = rig.broker.connections(f"gpu-exporter-{rig.node}") if rig.broker else 0
        rig.stop()
    out[rate] = _report(rate, minutes, rows, metrics, connections, duplicates, cpu, wire)


class _Tracer:
    """With --trace: every uplink packet (tcpdump, headers only) and TCP's state (``ss -tin``, ``nstat``)
    every half second, read in the edge namespace, into the run's directory (for a per-second timeline)."""

    def __init__(self, link: ShapedLink, where: Path) -> None:
        ns = ["ip", "netns", "exec", link.name]
        self._dump_out = open(where / "uplink.txt", "wb")  # noqa: SIM115 (closed in stop)
        self._dump: subprocess.Popen[bytes] | None = None
        if shutil.which("tcpdump") is None:
            print("bench_weak_link: --trace: no tcpdump here, TCP's state only", file=sys.stderr)
        else:
            self._dump = subprocess.Popen(
                [*ns, "tcpdump", "-i", link.edge_wan, "-n", "-tt", "-l", "-s", "96", "tcp"],
                stdout=self._dump_out,
                stderr=subprocess.DEVNULL,
            )
        self._ns = ns
        self._where = where
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        with open(self._where / "tcp.txt", "w") as out:
            while not self._stop.wait(0.5):
                ss = subprocess.run([*self._ns, "ss", "-tin", "state", "established"], capture_output=True, text=True)
                ns = subprocess.run([*self._ns, "nstat", "-az"], capture_output=True, text=True)
                keep = [
                    line
                    for line in ns.stdout.splitlines()
                    if line.split()[:1]
                    and line.split()[0] in ("TcpRetransSegs", "TCPSpuriousRtxHostQueues", "TCPLossProbes", "TcpOutSegs")
                ]
                out.write(f"@ {time.time():.2f}\n{ss.stdout}{chr(10).join(keep)}\n")
                out.flush()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        if self._dump is not None:
            stop_process(self._dump, timeout=5)
        self._dump_out.close()


def _cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return math.nan


def _fmt(v: float) -> str:
    return "-" if math.isnan(v) else ("none yet" if math.isinf(v) else f"{v:.0f}")


def _report(
    rate: float,
    minutes: float,
    rows: list[tuple[float, float, float]],
    metrics: dict[str, float],
    connections: int,
    duplicates: float,
    cpu: float,
    wire: dict[str, int],
) -> str:
    lines = [
        f"## {rate:.0f} B/s, {minutes:g} min",
        "",
        "| minute | all: max | all: median | any: max |",
        "|---|---|---|---|",
    ]
    for m in range(math.ceil(minutes)):
        inside = [(a, b) for t, a, b in rows if m * 60 <= t < (m + 1) * 60 and not math.isnan(a)]
        if not inside:
            continue
        alls = [a for a, _ in inside]
        finite = [a for a in alls if math.isfinite(a)] or [math.inf]
        lines.append(
            f"| {m + 1} | {_fmt(max(alls))} s | {_fmt(statistics.median(finite))} s | {_fmt(max(b for _, b in inside))} s |"
        )

    def get(name: str) -> float:
        return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))

    lines += [
        "",
        f"- connections: {connections} (reconnects: {max(0, connections - 1)}); batches resent (publish errors): "
        f"{get('gpu_exporter_forward_publish_errors_total'):.0f}; duplicates at the bridge: {duplicates:.0f}",
        f"- agent: link {get('gpu_exporter_forward_link_bytes_per_second'):.0f} B/s measured, full resolution needs "
        f"{get('gpu_exporter_forward_full_resolution_bytes_per_second'):.0f} B/s, summarising "
        f"{get('gpu_exporter_forward_summarizing'):.0f}, published {get('gpu_exporter_forward_published_bytes_total'):.0f} "
        f"payload bytes in {get('gpu_exporter_forward_published_batches_total'):.0f} batches, spool "
        f"{get('gpu_exporter_forward_spool_batches'):.0f} batches; CPU {cpu:.1f} s",
        f"- uplink: {wire['bytes']} bytes on the wire ({wire['bytes'] / (minutes * 60):.0f} B/s), {wire['dropped']} frames dropped by the bucket",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates", default="100,150,200,500,2000", help="bytes per second, comma-separated (%(default)s)"
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="real-time length of each run (%(default)s)")
    parser.add_argument("--poll", type=float, default=5.0, help="seconds between TSDB reads (%(default)s)")
    parser.add_argument("--parallel", action="store_true", help="run every rate at once")
    parser.add_argument("--keep", type=Path, help="keep the logs and every lag reading in this directory")
    parser.add_argument(
        "--trace", action="store_true", help="with --keep: every uplink packet and TCP's state, for a timeline"
    )
    parser.add_argument("--agent-arg", action="append", default=[], help="one more exporter option (repeatable)")
    parser.add_argument(
        "--burst", type=int, default=0, help="bytes the token bucket lends at once (default: one full frame, 1600)"
    )
    args = parser.parse_args()

    def stop(*_: object) -> None:  # a stop runs the clean-up: processes, namespaces (each rate's own thread too)
        STOP.set()
        sys.exit(1)

    signal.signal(signal.SIGTERM, stop)
    why = netns_unavailable()
    if why:
        print(f"bench_weak_link: {why}", file=sys.stderr)
        return 2
    rates = [float(r) for r in args.rates.split(",") if r.strip()]
    print(
        f"# bench_weak_link: rates {rates} B/s, {args.minutes:g} min each, {'parallel' if args.parallel else 'one at a time'}"
    )
    print(
        f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)\n", flush=True
    )
    out: dict[float, str] = {}
    extra = tuple(args.agent_arg)
    with tempfile.TemporaryDirectory(prefix="bench-weak-") as tmp:
        work = Path(tmp) if args.keep is None else args.keep
        work.mkdir(parents=True, exist_ok=True)
        tsdb = VictoriaMetricsServer(work / "vm")
        tsdb.start()
        try:
            if args.parallel:
                threads = [
                    threading.Thread(
                        target=run_rate,
                        args=(r, args.minutes, args.poll, tsdb, work, out, extra, args.trace, args.burst),
                    )
                    for r in rates
                ]
                run_together(threads, STOP)
            else:
                for r in rates:
                    run_rate(r, args.minutes, args.poll, tsdb, work, out, extra, args.trace, args.burst)
                    print(out[r], flush=True)
        finally:
            tsdb.stop()
    if args.parallel:
        for r in rates:
            print(out.get(r, f"## {r:.0f} B/s: failed\n"))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
