"""What grows with the number of nodes inside the bridge's writer path, without the noise of a fleet run.

One process: ``Bridge.process`` (decode, replay check, clock check, conversion, protobuf, snappy) on
one batch per node (fleet_payloads: what agents send), with the remote-write HTTP answered at once, so
only the bridge's own code is timed. Round 1 is every node's first batch; rounds 2 and 3 send the same
nodes again (the replay memory is cleared between rounds, so the batches count as new): the steady
state. Printed per node count: CPU per GPU-sample in each round (process time; the first round also
pays for new series), and how much the process's RSS grew from before the bridge was made to after
the rounds (what the bridge holds, with the allocator's own slack). The bridge gets the options an
operator of a fleet that size sets, as bench_fleet.py passes them (``fleet_args``: a series budget for
every node's 848 series and room for every node's name), read by the bridge's own command-line parser;
with the defaults a 1,000-node fleet would have most of its series refused, and refused series cost
nothing to write. Bridge sources to compare are given as directories (e.g. ``git archive`` of another
commit).

    PYTHONPATH=src python bench/fleet_scaling.py --nodes 100,1000,5000 [--src base=/tmp/base/src ...]
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def child(nodes: int, group: int) -> None:
    """Runs in a fresh interpreter whose sys.path starts with the bridge source under test."""
    from prometheus_client import CollectorRegistry

    from bench_fleet import fleet_args
    from fleet_payloads import Templates
    from gpu_exporter import config as cfg
    from gpu_exporter.bridge import sender
    from gpu_exporter.bridge.cli import build_parser, settings_from
    from gpu_exporter.bridge.clock import Stamp
    from gpu_exporter.bridge.dedup import SeqTracker
    from gpu_exporter.bridge.service import Bridge, Received

    gc.set_threshold(50_000, 50, 100)  # as `gpu-exporter bridge` (cli.tune_gc)
    sender.RemoteWriter._round_trip = lambda self, body: (204, b"", None)  # type: ignore[method-assign]
    templates = Templates(count=8)
    base = int(time.time() * 1000) - 3_600_000
    payloads = [templates.message(i, f"edge-{i:05d}", "boot", 1, base + i) for i in range(nodes)]
    stamp = Stamp(base + 10_000_000)
    msgs = [
        Received(i + 1, 1, f"gpu-exporter/edge-{m.node:05d}/batch", m.payload, stamp) for i, m in enumerate(payloads)
    ]
    gpu_samples = sum(m.gpu_samples for m in payloads)
    del payloads
    gc.collect()
    before = _rss()
    argv = ["--mqtt.url=mqtt://127.0.0.1:1", "--remote-write.url=http://127.0.0.1:1/", *fleet_args(nodes)]
    settings = settings_from(cfg.load(vars(build_parser().parse_args(argv))))
    registry = CollectorRegistry()
    bridge = Bridge(settings, registry)
    rounds = []
    for _r in range(3):
        bridge.dedup = SeqTracker()
        start = time.process_time()
        for i in range(0, len(msgs), group):
            bridge.process(msgs[i : i + group])
        rounds.append((time.process_time() - start) / gpu_samples * 1e6)
    limited = sum(
        s.value
        for m in registry.collect()
        if m.name.endswith("series_limited")
        for s in m.samples
        if s.name.endswith("_total")
    )
    gc.collect()
    held = _rss() - before
    print(f"{rounds[0]:.1f} {rounds[1]:.1f} {rounds[2]:.1f} {held / 1e6:.1f} {int(limited)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--group", type=int, default=1, help="messages per Bridge.process call")
    parser.add_argument("--src", action="append", default=[], help="LABEL=DIR of a bridge source (repeatable)")
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    sources = [s.split("=", 1) for s in args.src] or [["this tree", str(HERE.parent / "src")]]
    print(
        "bridge writer path in one process (HTTP answered at once), one 24-sample 8-GPU batch per node per "
        f"round, {args.group} message(s) per call; CPU us per GPU-sample: first contact / steady / steady; "
        "RSS growth of the process over the rounds"
    )
    print(
        "| bridge | nodes | round 1 (new nodes) | round 2 | round 3 | RSS growth MB | values refused by series limits |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.nodes.split(",")):
        for label, src in sources:
            env = {"PYTHONPATH": f"{src}:{HERE}"}
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(n), str(args.group)],
                capture_output=True,
                text=True,
                env={**os.environ, **env},
                check=False,
            )
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return 1
            r1, r2, r3, mem, limited = out.stdout.split()
            print(f"| {label} | {n:,} | {r1} | {r2} | {r3} | {mem} | {int(limited):,} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
