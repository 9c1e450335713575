"""GPU-samples per second one bridge process decodes and writes, per core of CPU time.

Batches as an 8-GPU edge node forwards them (the simulated H100 backend: ~90 values per GPU, 24 samples
per batch by default, i.e. the default 2 min at a 5 s interval; --samples 6 for 30 s batches) go through the bridge's writer path, ``Bridge.process``:
decode, replay check, conversion, protobuf, snappy, and HTTP POST to a real receiver (VictoriaMetrics
when installed, else a local sink that answers 204). MQTT receive is left out (paho's cost per message
is small next to a batch of 192 GPU-samples). Reported: the median of several runs of CPU seconds of this
process only (the receiver runs in another process), and a breakdown by stage.

    PYTHONPATH=src python bench/bench_bridge.py [--nodes 200] [--runs 5]
"""

from __future__ import annotations

import argparse
import http.server
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpu_exporter import config as cfg
from gpu_exporter.backends import base
from gpu_exporter.bridge.cli import tune_gc
from gpu_exporter.bridge.convert import Converter
from gpu_exporter.bridge.remote_write import WriteEncoder, compress
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.model import Sample
from gpu_exporter.payload import Batch, columns, decode, encode


def make_payloads(nodes: int, rounds: int, per_batch: int, gpus: int) -> list[list[bytes]]:
    """``rounds`` rounds of one batch per node: the same nodes again and again, as in production."""
    config = cfg.replace(cfg.Config(), gpu_vendor="fake", fake_gpus=gpus)
    backend = base.create(config)[0]
    t0 = time.time() - 3600
    out = []
    for r in range(rounds):
        samples = []
        for i in range(per_batch):
            seq = r * per_batch + i + 1
            samples.append(Sample(seq, t0 + 5 * seq, tuple(backend.read())))
        out.append([encode(Batch(f"edge-{n:05d}", f"boot-{n}", tuple(samples))) for n in range(nodes)])
    backend.close()
    return out


class _Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def start_receiver(workdir: Path) -> tuple[str, subprocess.Popen[bytes] | None, str]:
    vm = shutil.which("victoria-metrics")
    if vm:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen(
            [vm, f"-httpListenAddr=127.0.0.1:{port}", f"-storageDataPath={workdir}", "-loggerLevel=ERROR"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                return f"http://127.0.0.1:{port}/api/v1/write", proc, "VictoriaMetrics"
            except OSError:
                time.sleep(0.1)
        proc.kill()
        raise SystemExit("victoria-metrics did not start")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/api/v1/write", None, "a 204 sink (in this process)"


def run_rounds(url: str, rounds: list[list[bytes]], group: int) -> list[float]:
    """GPU-samples per CPU-second of each round; round 0 warms the caches (new nodes) and is left out."""
    bridge = Bridge(
        BridgeSettings(
            mqtt_url="mqtt://127.0.0.1:1",
            remote_write_url=url,
            max_messages=group,
            rw_max_samples=20_000,
            new_nodes_per_minute=1_000_000,  # the whole fleet introduces itself in round 0 (docs/bridge.md, Sizing)
            max_series=10_000_000,
        ),
        CollectorRegistry(),
    )
    rates = []
    for r, payloads in enumerate(rounds):
        msgs = [Received(i + 1, 1, f"gpu-exporter/edge-{i:05d}/batch", p) for i, p in enumerate(payloads)]
        before = bridge.metrics.gpu_samples._value.get()
        start = time.process_time()
        for i in range(0, len(msgs), group):
            bridge.process(msgs[i : i + group])
        cpu = time.process_time() - start
        if r:
            rates.append((bridge.metrics.gpu_samples._value.get() - before) / cpu)
    bridge.stop(1)
    return rates


def stages(warm: list[bytes], payloads: list[bytes]) -> dict[str, float]:
    """CPU seconds per GPU-sample of each stage, without HTTP, with warm caches."""
    out: dict[str, float] = {}
    conv = Converter()
    enc = WriteEncoder()
    for b in (columns.read(p) for p in warm):
        enc.encode(conv.convert([(b, None)]).series)
    t = time.process_time()
    batches = [columns.read(p) for p in payloads]
    out["decode"] = time.process_time() - t
    t = time.process_time()
    converted = [conv.convert([(b, None)]) for b in batches]
    out["convert"] = time.process_time() - t
    t = time.process_time()
    bodies = [enc.encode(c.series) for c in converted]
    out["protobuf"] = time.process_time() - t
    t = time.process_time()
    for body in bodies:
        compress(body)
    out["snappy"] = time.process_time() - t
    n = sum(c.gpu_samples for c in converted)
    return {k: v / n for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200, help="batches per run (one per node)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument(
        "--samples",
        type=int,
        default=round(cfg.Config().mqtt_batch_interval / 5),
        help="samples per batch (default: a default-length batch at a 5 s interval)",
    )
    parser.add_argument("--group", type=int, default=20, help="messages per remote write")
    parser.add_argument("--runs", type=int, default=5, help="rounds measured (after one warm-up round)")
    parser.add_argument("--stdlib-json", action="store_true", help="parse with json even if orjson is installed")
    args = parser.parse_args()
    if args.stdlib_json:
        columns._orjson = None  # type: ignore[assignment]
    parser_name = "orjson" if columns._orjson is not None else "json"

    rounds = make_payloads(args.nodes, args.runs + 1, args.samples, args.gpus)
    tune_gc()  # as `gpu-exporter bridge` does
    payloads = rounds[0]
    values = sum(len(d.values) for d in decode(payloads[0]).samples[0].devices) / args.gpus
    with tempfile.TemporaryDirectory() as tmp:
        url, proc, what = start_receiver(Path(tmp))
        try:
            rates = run_rounds(url, rounds, args.group)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    per = stages(rounds[0], rounds[1])
    median = statistics.median(rates)
    print(
        f"bridge: {args.nodes} nodes x {args.samples} samples x {args.gpus} GPUs ({values:.0f} values per GPU, "
        f"{sum(map(len, payloads)) / len(payloads) / 1024:.1f} KiB per payload), written to {what}, "
        f"parsed with {parser_name}"
    )
    print(f"  runs (GPU-samples per CPU-second): {', '.join(f'{r:,.0f}' for r in rates)}")
    print(
        f"  median: {median:,.0f} GPU-samples/s per core = {median * values:,.0f} series samples/s per core "
        f"= {median * 5 / args.gpus:,.0f} 8-GPU nodes at 5 s"
    )
    print("  CPU per GPU-sample by stage (no HTTP): " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in per.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
