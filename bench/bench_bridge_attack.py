"""Issue 20's attack on the bridge, re-run: the real bridge process (default options), a real Mosquitto,
and a remote-write target that fails (message floods) or a real Prometheus (labels, series).

Prints the bridge's peak RSS (VmHWM, from /proc) for each flood, and what got through:

* ``flood``: 60 messages of 10 MB on one node's topic while remote write fails (503), then it recovers;
* ``limit``: the same with 60 messages just under --bridge.max-payload (the largest the bridge takes):
  plain JSON of empty arrays, the most memory a parser can be made to spend per byte;
* ``bomb``: messages of ~16 KB that inflate to 16 MiB (``{},`` repeated), then a valid batch;
* ``labels``: 40 messages carrying 5,000 identity strings of 1 KB each, into Prometheus (``labels3500``:
  3,500, which inflate to less than --bridge.max-payload);
* ``series20`` / ``series40``: one million distinct series spread over 20 or 40 node names, into Prometheus
  (``series40away``: the same published while the bridge is stopped, into its session); ``seriesfleet``:
  enough names, each at the default --bridge.max-series-per-node, to fill the default --bridge.max-series
  a third over (the bridge's memory per series at its full fleet budget; ``seriesfleetaway``: into its
  session; neither in the default run);
* ``perbyte``: the peak memory of reading one payload, per byte of its JSON (tracemalloc, in process).

    PYTHONPATH=src python bench/bench_bridge_attack.py [--only flood,bomb] [--series 1000000] [-- BRIDGE ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from tests.support.bridge_attacks import bomb, info_flood, junk_document, peak_rss, rss, series_flood  # noqa: E402
from tests.support.bridge_helpers import BridgeProcess, Publisher, ScriptedReceiver, make_batch  # noqa: E402
from tests.support.tsdb import MosquittoServer, PrometheusServer, http_get, wait_until  # noqa: E402

from gpu_exporter import config as cfg  # noqa: E402
from gpu_exporter.payload import encode  # noqa: E402

MB = 1_000_000
MiB = 1 << 20


class Scene:
    """A broker, a receiver and a bridge process for one flood; ``close()`` stops them by PID."""

    def __init__(self, tmp: Path, name: str, write_url: str, bridge_args: list[str]) -> None:
        self.broker = MosquittoServer(tmp / f"{name}-mqtt")
        self.broker.start()
        self.bridge = BridgeProcess(tmp, self.broker, write_url, f"attack-{name}", *bridge_args)
        self.start_bridge()
        self.pub = Publisher(self.broker.port, client_id=f"attacker-{name}")

    def start_bridge(self) -> None:
        self.bridge.start()
        assert self.bridge.proc is not None
        self.pid = self.bridge.proc.pid

    def stop_bridge(self) -> None:
        proc = self.bridge.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)

    def total(self, name: str) -> float:
        """The sum of every series of a metric family (all label values); a bridge busy enough to keep
        its own /metrics waiting is given a minute."""
        page = http_get(f"http://127.0.0.1:{self.bridge.port}/metrics", 60).decode()
        return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith((name + " ", name + "{")))

    metric = total

    def drained(self, received: float) -> Callable[[], bool]:
        return lambda: (
            self.metric("gpu_exporter_bridge_messages_received_total") >= received
            and self.metric("gpu_exporter_bridge_queue_messages") == 0
        )

    def settle(self, timeout: float, quiet: float = 10.0) -> bool:
        """Wait until the bridge holds nothing and has received nothing more for ``quiet`` seconds
        (the broker has handed over all it will); False after ``timeout``."""
        deadline = time.monotonic() + timeout
        seen, since = -1.0, time.monotonic()
        while time.monotonic() < deadline:
            received = self.metric("gpu_exporter_bridge_messages_received_total")
            if received != seen or self.metric("gpu_exporter_bridge_queue_messages"):
                seen, since = received, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return True
            time.sleep(1.0)
        return False

    def close(self) -> None:
        self.pub.close()
        self.stop_bridge()
        self.broker.stop()


def message_flood(tmp: Path, bridge_args: list[str], name: str, size: int, count: int) -> str:
    """``count`` messages of ``size`` bytes behind one valid batch, while remote write answers 503."""
    failing = [True]
    with ScriptedReceiver(lambda n: (503, b"down", {}) if failing[0] else (204, b"", {})) as rx:
        scene = Scene(tmp, name, rx.url, bridge_args)
        try:
            t = time.time()
            node = "edge-flood"
            scene.pub.publish(f"gpu-exporter/{node}/batch", encode(make_batch(node, "b", [1, 2], t - 30)))
            wait_until(lambda: len(rx.requests) >= 2, 30, "the writer to be retrying")
            junk = junk_document(node, size, int(t * 1000))
            for _ in range(count):
                scene.pub.publish(f"gpu-exporter/{node}/batch", junk, timeout=120)
            time.sleep(5)  # whatever the broker will hand over arrives meanwhile
            during = peak_rss(scene.pid)
            sent = scene.metric("gpu_exporter_bridge_messages_received_total")
            held = scene.metric("gpu_exporter_bridge_queue_messages")
            failing[0] = False
            start = time.monotonic()
            if scene.settle(900):
                after = f"drained in {time.monotonic() - start - 10:.0f} s"
            else:
                after = "not drained after 900 s"
            received = scene.metric("gpu_exporter_bridge_messages_received_total")
            dropped = scene.total("gpu_exporter_bridge_payloads_dropped_total")
            written = scene.metric("gpu_exporter_bridge_gpu_samples_written_total")
            return (
                f"{count} x {size / MB:.1f} MB while remote write fails: peak RSS {during / MiB:.0f} MiB, "
                f"{held:.0f} messages held ({sent:.0f} received); remote write back: {after}, "
                f"peak {peak_rss(scene.pid) / MiB:.0f} MiB, "
                f"{received:.0f} received, {dropped:.0f} dropped as bad payloads, {written:.0f} GPU-samples written"
            )
        finally:
            scene.close()


def inflation_bomb(tmp: Path, bridge_args: list[str], count: int = 5) -> str:
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        scene = Scene(tmp, "bomb", rx.url, bridge_args)
        try:
            t = time.time()
            payload = bomb("edge-bomb", 16 * MiB, int(t * 1000))
            for _ in range(count):
                scene.pub.publish("gpu-exporter/edge-bomb/batch", payload)
            scene.pub.publish("gpu-exporter/edge-bomb/batch", encode(make_batch("edge-bomb", "b", [1], t - 10)))
            wait_until(scene.drained(count + 1), 120, "the bombs and the batch")
            dropped = scene.total("gpu_exporter_bridge_payloads_dropped_total")
            return (
                f"{count} x {len(payload) / 1024:.1f} KB inflating to 16 MiB: peak RSS {peak_rss(scene.pid) / MiB:.0f} "
                f"MiB, {dropped:.0f} dropped, written samples "
                f"{scene.metric('gpu_exporter_bridge_gpu_samples_written_total'):.0f}"
            )
        finally:
            scene.close()


def _prometheus(tmp: Path, name: str) -> PrometheusServer:
    prom = PrometheusServer(tmp / f"{name}-prom", ooo_window="2h")
    prom.start()
    return prom


def _head_series(prom: PrometheusServer) -> int:
    return int(json.loads(http_get(f"{prom.url}/api/v1/status/tsdb", 60))["data"]["headStats"]["numSeries"])


def label_flood(tmp: Path, bridge_args: list[str], keys: int, noise: bool = False, count: int = 40) -> str:
    prom = _prometheus(tmp, "labels")
    scene = Scene(tmp, "labels", prom.write_url, bridge_args)
    try:
        assert prom.proc is not None
        prom_before = rss(prom.proc.pid)
        t = time.time() - 30
        payloads = [info_flood(f"edge-info-{i:02d}", t, keys=keys, noise=noise) for i in range(count)]
        for i, payload in enumerate(payloads):
            scene.pub.publish(f"gpu-exporter/edge-info-{i:02d}/batch", payload)
        wait_until(scene.drained(count), 300, "the label flood")
        url = f"{prom.url}/api/v1/query?{urllib.parse.urlencode({'query': 'gpu_info'})}"
        result = json.loads(http_get(url, 300))["data"]["result"]  # 5,000-label series take a while
        widest = max((len(r["metric"]) for r in result), default=0)
        longest = max((len(v) for r in result for v in r["metric"].values()), default=0)
        return (
            f"{count} messages ({sum(map(len, payloads)) / 1000:.0f} KB compressed) with {keys:,} labels of 1 KB: "
            f"bridge peak RSS {peak_rss(scene.pid) / MiB:.0f} MiB; Prometheus {prom_before / MiB:.0f} -> "
            f"{rss(prom.proc.pid) / MiB:.0f} MiB; {len(result)} gpu_info series, at most {widest} labels, "
            f"longest value {longest} characters"
        )
    finally:
        scene.close()
        prom.stop()


def series_spread(tmp: Path, bridge_args: list[str], names: int, total: int, away: bool = False) -> str:
    """``away``: the flood is published while the bridge is stopped, into its session, and the bridge
    started again (a session's backlog is not rate-limited by name: the worst case)."""
    prom = _prometheus(tmp, f"series{names}")
    scene = Scene(tmp, f"series{names}", prom.write_url, bridge_args)
    try:
        assert prom.proc is not None
        messages = series_flood([f"edge-spread-{i:03d}" for i in range(names)], total, time.time() - 60)
        before = rss(scene.pid)
        if away:
            scene.stop_bridge()
        for topic, payload in messages:
            scene.pub.publish(topic, payload, timeout=60)
        if away:
            scene.start_bridge()
        wait_until(scene.drained(len(messages)), 900, "the series flood", interval=1.0)
        time.sleep(2)
        series, peak = _head_series(prom), peak_rss(scene.pid)
        per_series = (
            f", {(peak - before) / series:,.0f} B per series over its RSS before" if series and not away else ""
        )
        return (
            f"{total:,} series over {names} node names ({sum(len(p) for _, p in messages) / MB:.1f} MB compressed): "
            f"bridge peak RSS {peak / MiB:.0f} MiB (before {before / MiB:.0f} MiB{per_series}); "
            f"{series:,} series in Prometheus "
            f"(RSS {rss(prom.proc.pid) / MiB:.0f} MiB); values refused by the series limits "
            f"{scene.total('gpu_exporter_bridge_series_limited_total'):,.0f}; batches of new names refused "
            f"{scene.total('gpu_exporter_bridge_new_nodes_refused_total'):,.0f}"
        )
    finally:
        scene.close()
        prom.stop()


def memory_per_byte(tmp: Path, bridge_args: list[str]) -> str:
    """Peak Python memory (tracemalloc) of reading one payload, per byte of its JSON, in this process."""
    import tracemalloc

    from gpu_exporter.backends import base
    from gpu_exporter.model import Sample
    from gpu_exporter.payload import Batch, columns

    backend = base.create(cfg.replace(cfg.Config(), gpu_vendor="fake", fake_gpus=8))[0]
    t = time.time() - 3600
    samples = tuple(Sample(i + 1, t + 5 * i, tuple(backend.read())) for i in range(24))
    backend.close()
    batch = Batch("edge-1", "boot", samples)
    cases = {
        "a batch of 8 GPUs x 24 samples": (encode(batch), len(encode(batch, compress=False))),
        "4 MB of []": (junk_document("edge-1", 4 * MB, int(t * 1000)),) * 2,
        "4 MB of {}": (junk_document("edge-1", 4 * MB, int(t * 1000), unit=b"{},"),) * 2,
    }
    out = []
    for name, (payload, text) in cases.items():
        size = text if isinstance(text, int) else len(text)
        tracemalloc.start()
        try:
            columns.read(payload)
        except Exception:  # the junk is refused after parsing: what parsing cost is the point
            pass
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        out.append(f"{name}: {peak / size:.1f}x")
    return "peak memory of reading a payload per byte of its JSON: " + ", ".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        default="flood,limit,bomb,labels,labels3500,series20,series40,series40away,perbyte",
        help="floods to run",
    )
    parser.add_argument("--series", type=int, default=1_000_000, help="distinct series in the series floods")
    parser.add_argument("bridge_args", nargs="*", help="extra bridge options (after --)")
    args = parser.parse_args()
    for tool in ("mosquitto", "prometheus"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            raise SystemExit(f"{tool} is not installed")
    limit = cfg.Config().bridge_max_payload
    for arg in args.bridge_args:
        if arg.startswith("--bridge.max-payload="):
            from gpu_exporter.units import parse_size

            limit = parse_size(arg.partition("=")[2])
    defaults = cfg.Config()
    per_node = defaults.bridge_max_series_per_node
    fleet_names = -(-defaults.bridge_max_series * 4 // 3 // per_node)
    floods: dict[str, Callable[[Path, list[str]], str]] = {
        "flood": lambda d, a: message_flood(d, a, "flood", 10 * MB, 60),
        "limit": lambda d, a: message_flood(d, a, "limit", limit - 1024, 60),
        "bomb": inflation_bomb,
        "labels": lambda d, a: label_flood(d, a, 5000),
        "labels3500": lambda d, a: label_flood(d, a, 3500, noise=True),
        "series20": lambda d, a: series_spread(d, a, 20, args.series),
        "series40": lambda d, a: series_spread(d, a, 40, args.series),
        "series40away": lambda d, a: series_spread(d, a, 40, args.series, away=True),
        # enough names, each at --bridge.max-series-per-node, to fill --bridge.max-series (a third more)
        "seriesfleet": lambda d, a: series_spread(d, a, fleet_names, fleet_names * per_node),
        "seriesfleetaway": lambda d, a: series_spread(d, a, fleet_names, fleet_names * per_node, away=True),
        "perbyte": memory_per_byte,
    }
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix=f"attack-{name}-") as tmp:
            start = time.monotonic()
            line = floods[name](Path(tmp), args.bridge_args)
            print(f"{name}: {line} ({time.monotonic() - start:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
