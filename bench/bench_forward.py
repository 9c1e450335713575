"""Forwarding figures: bytes per GPU-sample, backlog drain time, exporter RSS with a full spool.

    python bench/bench_forward.py                 # all three, median of 3 runs where it varies
    python bench/bench_forward.py --only bytes    # or drain, rss

Samples come from the simulated NVML library read by the real NVML backend (integer percent, mW, MHz,
bytes, as a driver reports them), 8 GPUs, timestamps 5 s apart. Mosquitto and the exporter are real
processes on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid as uuidlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import paho.mqtt.client as paho  # noqa: E402
from paho.mqtt.enums import CallbackAPIVersion  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from gpu_exporter import config as cfg  # noqa: E402
from gpu_exporter.backends.fake.backend import SimNvml  # noqa: E402
from gpu_exporter.backends.nvidia.backend import NvmlBackend  # noqa: E402
from gpu_exporter.exposition import native_view, render  # noqa: E402
from gpu_exporter.forward.prepare import round_values  # noqa: E402
from gpu_exporter.forward.service import MAX_GROWTH, Forwarder  # noqa: E402
from gpu_exporter.forward.spool import Spool  # noqa: E402
from gpu_exporter.model import DeviceId, DeviceSample, Sample  # noqa: E402
from gpu_exporter.payload import Batch, encode, peek  # noqa: E402
from gpu_exporter.ring import RingBuffer  # noqa: E402
from gpu_exporter.units import parse_size  # noqa: E402

GPUS = 8
DIGITS = cfg.Config().mqtt_value_digits  # what the forwarder sends by default
INTERVAL = 5.0
TOPIC = "gpu-exporter/bench-node/batch"
MQTT_FRAMING = 2 + 2 + len(TOPIC) + 2 + 1 + 4  # PUBLISH header, topic, packet id, v5 properties; PUBACK


def simulated_samples(n: int, start_seq: int = 1, t0: float = 1_764_000_000.0) -> list[Sample]:
    """``n`` distinct samples of 8 simulated GPUs, 5 s apart (the simulator runs on a fake clock).

    The simulator's UUIDs and serial numbers are patterned (GPU-00000000-0001-...); real ones are random
    and cost more bytes, in the payload and in the Prometheus text alike. Each GPU gets a random UUID
    and serial (seeded, so every run measures the same bytes)."""
    now = [t0]
    sim = SimNvml(gpus=GPUS, clock=lambda: now[0])
    backend = NvmlBackend(cfg.Config(gpu_vendor="fake", fake_gpus=GPUS), nvml=sim)
    backend.open()
    rng = random.Random(20261129)
    real: dict[DeviceId, tuple[DeviceId, dict[str, str]]] = {}
    out = []
    for i in range(n):
        now[0] = t0 + i * INTERVAL
        devices = []
        for dev in backend.read():
            if dev.device not in real:
                uuid = f"GPU-{uuidlib.UUID(int=rng.getrandbits(128))}"
                real[dev.device] = (
                    DeviceId(dev.device.gpu, uuid),
                    {**dev.info, "serial": str(rng.randrange(10**12, 10**13))},
                )
            device, info = real[dev.device]
            devices.append(DeviceSample(device, dev.up, dev.values, info, dev.processes))
        out.append(round_values(Sample(start_seq + i, now[0], tuple(devices)), DIGITS))
    backend.close()
    return out


def replicate(base: list[Sample], n: int, start_seq: int = 1, t0: float = 1_764_000_000.0) -> list[Sample]:
    """``n`` samples cycling through ``base`` with fresh sequence numbers and timestamps."""
    return [Sample(start_seq + i, t0 + i * INTERVAL, base[i % len(base)].devices) for i in range(n)]


# ------------------------------------------------------------------------------------------------ bytes


def bench_bytes() -> dict[str, float]:
    samples = simulated_samples(720)  # one hour
    view = native_view()
    prom = [len(gzip.compress(render(s, view).encode(), compresslevel=6, mtime=0)) for s in samples]
    prom_per_gpu = sum(prom) / (len(samples) * GPUS)
    print(
        f"  Prometheus text, gzip per scrape: {prom_per_gpu:.1f} bytes per GPU-sample "
        f"({statistics.mean(prom):.0f} bytes per 8-GPU page)"
    )
    figures = {"prometheus_gzip": prom_per_gpu}
    default = round(cfg.Config().mqtt_batch_interval / INTERVAL)
    for label, per_batch in (
        ("30 s batches", 6),
        ("60 s batches", 12),
        ("2 min batches", 24),
        ("5 min batches", 60),
        (f"outage batches ({MAX_GROWTH}x the default)", default * MAX_GROWTH),
    ):
        if per_batch == default:
            label += " (default)"
        total = 0
        plain = 0
        for i in range(0, len(samples), per_batch):
            batch = Batch("bench-node", "b" * 32, tuple(samples[i : i + per_batch]))
            total += len(encode(batch)) + MQTT_FRAMING
            plain += len(encode(batch, compress=False))
        per_gpu = total / (len(samples) * GPUS)
        figures[label] = per_gpu
        print(
            f"  payload, {label}: {per_gpu:.1f} bytes per GPU-sample on the wire "
            f"(1/{prom_per_gpu / per_gpu:.1f} of Prometheus gzip; plain JSON {plain / (len(samples) * GPUS):.0f})"
        )
    return figures


# ------------------------------------------------------------------------------------------------ mosquitto


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mosquitto:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        conf = workdir / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "max_queued_messages 0"]
        if os.geteuid() == 0:
            lines.append("user root")
        conf.write_text("\n".join(lines) + "\n")
        self.conf = conf
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc = subprocess.Popen([exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
            self.proc = None


class Counter:
    """Subscribes and records the sequence numbers per boot."""

    def __init__(self, port: int) -> None:
        self.seqs: dict[str, set[int]] = {}
        self.lock = threading.Lock()
        self.client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="bench-counter")
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.subscribe("gpu-exporter/+/batch", qos=1)
        self.client.loop_start()

    def _on_message(self, client: paho.Client, userdata: object, msg: paho.MQTTMessage) -> None:
        head = peek(msg.payload)  # the sequence numbers are all this counter needs
        with self.lock:
            self.seqs.setdefault(head.boot, set()).update(head.seqs)

    def count(self, boot: str) -> int:
        with self.lock:
            return len(self.seqs.get(boot, ()))

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


# ------------------------------------------------------------------------------------------------ drain


def outage_batches(samples: list[Sample], boot: str) -> list[Batch]:
    """Batches as the forwarder forms them during an outage: each one twice as long, up to 16x the
    default --mqtt.batch-interval."""
    first = round(cfg.Config().mqtt_batch_interval / INTERVAL)
    out, i, span = [], 0, first
    while i < len(samples):
        out.append(Batch("bench-node", boot, tuple(samples[i : i + span])))
        i += span
        span = min(first * MAX_GROWTH, span * 2)
    return out


def bench_drain(runs: int, replay_rates: tuple[str, ...]) -> dict[str, float]:
    n = int(24 * 3600 / INTERVAL)  # 17280 samples
    base = simulated_samples(720)
    backlog = replicate(base, n)
    payloads = [(encode(b), b) for b in outage_batches(backlog, "backlog" + "0" * 25)]
    spool_mib = sum(len(p) for p, _ in payloads) / 2**20
    print(f"  backlog: {n} samples x {GPUS} GPUs in {len(payloads)} batches, {spool_mib:.1f} MiB in the spool")
    figures: dict[str, float] = {}
    for rate in replay_rates:
        times = []
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as tmp:
                work = Path(tmp)
                broker = Mosquitto(work)
                broker.start()
                spool = Spool(str(work / "spool"), 1 << 40, 1e9)
                spool.open()
                for data, b in payloads:
                    spool.put(data, b.first_seq, b.last_seq, len(b.samples))
                spool.close()
                counter = Counter(broker.port)
                config = cfg.load(
                    {
                        "mqtt.url": f"mqtt://127.0.0.1:{broker.port}",
                        "node-name": "bench-node",
                        "spool.dir": str(work / "spool"),
                        "spool.replay-rate": rate,
                    },
                    environ={},
                )
                ring = RingBuffer(1024)
                fwd = Forwarder(config, ring, CollectorRegistry())
                stop = threading.Event()

                def fresh(stop: threading.Event = stop, ring: RingBuffer = ring) -> None:
                    seq = 0
                    while not stop.is_set():
                        seq += 1
                        ring.append(Sample(seq, time.time(), base[seq % len(base)].devices))
                        stop.wait(INTERVAL)

                feeder = threading.Thread(target=fresh, daemon=True)
                feeder.start()
                t0 = time.monotonic()
                fwd.start()
                deadline = t0 + 300
                while counter.count(payloads[0][1].boot) < n and time.monotonic() < deadline:
                    time.sleep(0.05)
                elapsed = time.monotonic() - t0
                fresh_boot = fwd.boot
                got_fresh = counter.count(fresh_boot)
                stop.set()
                fwd.stop(5)
                counter.close()
                broker.stop()
                times.append(elapsed)
                print(f"    replay-rate {rate}/s: drained in {elapsed:.1f} s (fresh samples meanwhile: {got_fresh})")
        figures[f"drain_s_rate_{rate}"] = statistics.median(times)
        print(f"  drain of a 24 h backlog at --spool.replay-rate={rate}: median {statistics.median(times):.1f} s")
    return figures


# ------------------------------------------------------------------------------------------------ rss

# The exporter as `python -m gpu_exporter` runs it, except for how its ring fills: at the bench's 1 s interval
# that would take minutes (256 samples: 4, 1024: 17). At start the sampler thread collects back to back
# until the ring is full (each sample one collect cycle of the backend, rendered by the exposition), and
# only then does the forwarder start, from the newest sample, as if it had taken every earlier one when it
# came (those are in the spool, which the bench fills to its cap beforehand). From then on the sampler
# keeps its interval.
_FAST_FILL = """
import sys
from gpu_exporter import cli, sampler

def run(self, _run=sampler.Sampler.run):
    while len(self.ring) < self.ring.capacity:
        self.collect_once()
        if self._wait(0.002):
            return
    _run(self)

def start(self, _start=sampler.Sampler.start):
    _start(self)
    while len(self.ring) < self.ring.capacity and not self._stop.is_set():
        self.ring.wait_after(self.ring.latest().seq if len(self.ring) else 0, 1.0)
    forward = sys.modules.get("gpu_exporter.forward.service")
    if forward is not None:
        def follow(forwarder, _follow=forward.Forwarder.start):
            newest = forwarder.ring.latest()
            forwarder._last_seq = newest.seq if newest is not None else 0
            _follow(forwarder)
        forward.Forwarder.start = follow

sampler.Sampler.run = run
sampler.Sampler.start = start
sys.exit(cli.main(sys.argv[1:]))
"""
RING = cfg.Config().buffer_size  # the default --metrics-buffer-size: the figures are for that ring, full


def rss_kib(pid: int) -> tuple[int, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def reset_peak(pid: int) -> None:
    """Start the process's VmHWM afresh (Linux), so that the peak leaves the fast fill out."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def _exporter(port: int, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = [
        sys.executable,
        "-c",
        _FAST_FILL,
        "--gpu-vendor=fake",
        f"--fake.gpus={GPUS}",
        "--gpu-metrics-collection-interval=1s",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=error",
        *extra,
    ]
    return subprocess.Popen(args, env=env)


def _fill(proc: subprocess.Popen[bytes], port: int, timeout: float = 120.0) -> float:
    """Seconds until the exporter says (gpu_exporter_ring_samples) that its ring is full."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                page = response.read().decode()
        except OSError:
            page = ""
        for line in page.splitlines():
            if line.startswith("gpu_exporter_ring_samples ") and float(line.split()[1]) >= RING:
                reset_peak(proc.pid)
                return time.monotonic() - started
        time.sleep(0.5)
    raise RuntimeError(f"the ring did not fill within {timeout:.0f} s")


def bench_rss(cap: str, seconds: float) -> dict[str, float]:
    """RSS of the exporter without forwarding, and with forwarding and a spool at its cap (broker down,
    then draining); both with the default ring, full. Each figure is taken ``seconds`` after the previous
    step, at a 1 s interval."""
    port = free_port()
    plain = _exporter(port)
    try:
        filled = _fill(plain, port)
        time.sleep(seconds)
        base_rss = rss_kib(plain.pid)
    finally:
        plain.send_signal(signal.SIGTERM)
        plain.wait(20)
    cap_bytes = parse_size(cap)
    base = simulated_samples(96)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one = encode(Batch("bench-node", "old" + "0" * 29, tuple(base)), level=1)
        spool = Spool(str(work / "spool"), cap_bytes, 1e9)
        spool.open()
        for _ in range(cap_bytes // len(one) + 2):  # a spool at its cap
            spool.put(one, base[0].seq, base[-1].seq, len(base))
        print(f"  spool prefilled: {len(spool)} batches, {spool.total_bytes / 2**20:.0f} MiB (cap {cap})")
        spool.close()
        broker = Mosquitto(work)
        port = free_port()
        proc = _exporter(
            port,
            f"--mqtt.url=mqtt://127.0.0.1:{broker.port}",
            f"--spool.dir={work / 'spool'}",
            f"--spool.max-bytes={cap}",
            "--mqtt.batch-interval=2s",
            "--mqtt.reconnect-max-delay=1s",
            "--spool.replay-rate=20",
        )
        try:
            _fill(proc, port)
            time.sleep(seconds)  # broker down: sampling, spooling at the cap
            offline = rss_kib(proc.pid)
            broker.start()
            time.sleep(seconds)  # broker up: draining the full spool
            online = rss_kib(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
            broker.stop()
    print(
        f"  exporter RSS, {GPUS} GPUs, the default ring of {RING} samples full (filled in {filled:.0f} s), "
        f"no forwarding: {base_rss[0] / 1024:.1f} MiB"
    )
    print(f"  with forwarding, full spool, broker down: {offline[0] / 1024:.1f} MiB")
    print(
        f"  while draining: {online[0] / 1024:.1f} MiB; peak since the ring filled (VmHWM) {online[1] / 1024:.1f} MiB"
    )
    return {
        "rss_plain_mib": base_rss[0] / 1024,
        "rss_offline_mib": offline[0] / 1024,
        "rss_draining_mib": online[0] / 1024,
        "rss_peak_mib": online[1] / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("bytes", "drain", "rss"))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rss-cap", default="256MiB", help="spool cap for the RSS figure")
    parser.add_argument("--rss-seconds", type=float, default=10, help="settling time before each RSS figure")
    args = parser.parse_args()
    if args.only in (None, "bytes"):
        print("bytes on the wire per GPU-sample:")
        bench_bytes()
    if args.only in (None, "drain"):
        print("drain of a 24 h backlog (8 GPUs, 5 s interval) on loopback, fresh samples flowing:")
        bench_drain(args.runs, ("10", "50"))
    if args.only in (None, "rss"):
        print("exporter RSS with forwarding and a full spool:")
        bench_rss(args.rss_cap, args.rss_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
