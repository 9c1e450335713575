"""What the agent's health reports cost on the link (forward/health.py, docs/forwarding.md).

    python bench/bench_health.py                  # 8 simulated GPUs, 30 s
    python bench/bench_health.py --gpus 1 --seconds 60

Runs the exporter CLI (simulated GPUs, forwarding every 2 s) against a real Mosquitto on 127.0.0.1 and
a subscriber that keeps every health report it receives: the payloads as the real encoder wrote them.
Prints their size compressed (what is published), as plain JSON, the MQTT PUBLISH they travel in (topic,
packet id, the send-time property) and the number of values. Nothing depends on the GPU count but the
backend's own lines (one per backend), so the figure is per report, whatever the node.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support.agent_proc import Proc  # noqa: E402
from tests.support.mosquitto import Collector  # noqa: E402
from tests.support.tsdb import MosquittoServer  # noqa: E402

from gpu_exporter.mqtt.packet import publish_size  # noqa: E402
from gpu_exporter.payload import decode, encode  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (%(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to collect (%(default)s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-health-") as folder:
        tmp = Path(folder)
        broker = MosquittoServer(tmp / "mqtt")
        broker.start()
        agent = Proc(
            tmp,
            "--gpu-vendor=fake",
            f"--fake.gpus={args.gpus}",
            "--gpu-metrics-collection-interval=1s",
            "--node-name=edge-gpu-07",
            f"--mqtt.url={broker.url}",
            f"--spool.dir={tmp / 'spool'}",
            "--mqtt.batch-interval=2s",
        )
        try:
            with Collector(broker) as collector:
                agent.start()
                time.sleep(args.seconds)
                reports = list(collector.health)
        finally:
            agent.stop()
            broker.stop()
    if not reports:
        print("no health report arrived", file=sys.stderr)
        return 1
    topic = "gpu-exporter/edge-gpu-07/batch"
    sizes = [len(encode(r)) for r in reports]
    plain = [len(encode(r, compress=False)) for r in reports]
    assert all(decode(encode(r)) == r for r in reports)
    print(f"{len(reports)} health reports of {len(reports[-1].health)} values ({args.gpus} simulated GPUs)")
    print(f"  payload (zlib, preset dictionary): median {statistics.median(sizes):.0f} B, max {max(sizes)} B")
    print(f"  plain JSON:                        median {statistics.median(plain):.0f} B")
    packet = [publish_size(topic, s) for s in sizes]
    print(f"  MQTT 5 PUBLISH (topic {topic}): median {statistics.median(packet):.0f} B, max {max(packet)} B")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
