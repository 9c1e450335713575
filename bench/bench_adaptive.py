"""Adaptive forwarding figures (issue 15): summaries against full resolution on weak links.

    python bench/bench_adaptive.py                  # all parts, median of 3 runs where it varies
    python bench/bench_adaptive.py --only bytes     # or fresh, outage; --runs N

bytes   Codec level, real payloads: 8 GPUs of the simulated NVML library read by the real NVML backend,
        a sample a second, rounded as the forwarder does. Bytes per GPU-sample of full resolution (30 s
        batches, and the 8-minute batches of an outage) against summaries (min/max/mean/last per gauge,
        last per counter) of 30 s to 8 min windows; then the model of a 24 h outage on a 2 kB/s link:
        the batches the forwarder spools (spans doubling from 30 s to 8 min while the broker is away),
        the summaries of them that go first on reconnect, and how long each takes at 2 kB/s.
fresh   Real processes: the forwarder with 8 simulated GPUs, tests/support/tcp_proxy.py, Mosquitto, the bridge,
        VictoriaMetrics. Time from a planted 3-sample spike until the TSDB shows it, in batch intervals:
        as a summary's max on a link of 2/3 of what full resolution needs (the issue's 200 B/s against
        about 300 B/s), and, as the baseline, as a raw sample on an unshaped link.
outage  The same processes: a 20 s outage (200 samples), then the time until the TSDB shows the
        outage's first quarter (as summaries, or raw) and every raw sample of it, on links of 1.9 and 6.25
        times what full resolution needs (the issue's 2 kB/s against 320 B/s is 6.25). A 20 s backlog
        is short next to a 6.25x link (it drains in two batch intervals, so no summaries go first);
        the 24 h figure is the model of the bytes part, from real payloads.

The runs are scaled as tests/integration/test_forward_weak_link.py is: ten times faster (a sample every 0.1 s, a
batch every 3 s) and ten times the bytes per second, so every batch carries the bytes it would at full
scale; times in batch intervals are the same at both scales, seconds are multiplied by ten.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid as uuidlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from prometheus_client import CollectorRegistry  # noqa: E402
from tests.integration.test_forward_weak_link import Sampler  # noqa: E402
from tests.support.bridge_helpers import BridgeProcess  # noqa: E402
from tests.support.mosquitto import Collector  # noqa: E402
from tests.support.tcp_proxy import TcpProxy  # noqa: E402
from tests.support.tsdb import MosquittoServer, VictoriaMetricsServer, wait_until  # noqa: E402

from gpu_exporter import config as cfg  # noqa: E402
from gpu_exporter.backends.fake.backend import SimNvml  # noqa: E402
from gpu_exporter.backends.nvidia.backend import NvmlBackend  # noqa: E402
from gpu_exporter.forward.adaptive import COARSE_SECONDS, Adaptive  # noqa: E402
from gpu_exporter.forward.link_meter import LinkMeter  # noqa: E402
from gpu_exporter.forward.prepare import round_values  # noqa: E402
from gpu_exporter.forward.service import MAX_GROWTH, Forwarder  # noqa: E402
from gpu_exporter.forward.summary import encode_summary, summarize  # noqa: E402
from gpu_exporter.model import DeviceId, DeviceSample, Sample  # noqa: E402
from gpu_exporter.payload import Batch, encode  # noqa: E402
from gpu_exporter.ring import RingBuffer  # noqa: E402

GPUS = 8
FULL_BATCH = 30.0  # seconds, at full scale
SCALE = 10.0  # the live runs: ten times faster, ten times the bytes per second
BATCH = FULL_BATCH / SCALE
FRAMING = 2 + 2 + len("gpu-exporter/bench-node/batch") + 2 + 1 + 4  # PUBLISH + PUBACK, as bench_forward
LINK = 2000.0  # the weak link after an outage, bytes per second


def samples_at(n: int, interval: float = 1.0, t0: float = 1_764_000_000.0) -> list[Sample]:
    """``n`` samples of 8 simulated GPUs ``interval`` seconds apart (a fake clock), with random UUIDs and
    serials as real GPUs have, rounded to 4 digits as the forwarder sends them."""
    now = [t0]
    backend = NvmlBackend(cfg.Config(gpu_vendor="fake", fake_gpus=GPUS), nvml=SimNvml(gpus=GPUS, clock=lambda: now[0]))
    backend.open()
    rng = random.Random(20261201)
    real: dict[DeviceId, tuple[DeviceId, dict[str, str]]] = {}
    out = []
    for i in range(n):
        now[0] = t0 + i * interval
        devices = []
        for dev in backend.read():
            if dev.device not in real:
                uuid = f"GPU-{uuidlib.UUID(int=rng.getrandbits(128))}"
                real[dev.device] = (DeviceId(dev.device.gpu, uuid), {**dev.info, "serial": str(rng.getrandbits(40))})
            device, info = real[dev.device]
            devices.append(DeviceSample(device, dev.up, dev.values, info))
        out.append(round_values(Sample(i + 1, now[0], tuple(devices)), 4))
    backend.close()
    return out


def raw_bytes(samples: list[Sample], per_batch: int) -> int:
    return sum(
        len(encode(Batch("bench-node", "b" * 32, tuple(samples[i : i + per_batch])))) + FRAMING
        for i in range(0, len(samples), per_batch)
    )


def summary_bytes(samples: list[Sample], window: int, points_per_batch: int) -> int:
    points = [summarize(samples[i : i + window]) for i in range(0, len(samples), window)]
    return sum(
        len(encode_summary("bench-node", "b" * 32, points[i : i + points_per_batch], window)) + FRAMING
        for i in range(0, len(points), points_per_batch)
    )


def bench_bytes() -> None:
    samples = samples_at(3840)  # 64 minutes at 1 s: eight 8-minute windows
    n = len(samples) * GPUS
    full = raw_bytes(samples, 30) / n
    outage_full = raw_bytes(samples, 480) / n
    print(f"  full resolution, 30 s batches: {full:.1f} bytes per GPU-sample ({full * GPUS:.0f} B/s for 8 GPUs)")
    print(f"  full resolution, 8 min batches (an outage's): {outage_full:.1f} bytes per GPU-sample")
    for window, per in ((30, 1), (60, 1), (120, 1), (300, 1), (480, 64)):
        size = summary_bytes(samples, window, per)
        how = "one window per batch (live)" if per == 1 else f"{per} windows per batch (an outage's backlog)"
        print(
            f"  summaries of {window:>3} s windows, {how}: {size / n:.2f} bytes per GPU-sample, "
            f"{size / (len(samples) / window):.0f} bytes per window of 8 GPUs ({size / len(samples):.0f} B/s)"
        )
    # A 24 h outage as the forwarder spools it: batch spans double from 30 s up to MAX_GROWTH x 30 s.
    spans, covered, span = [], 0.0, FULL_BATCH
    while covered < 86400:
        spans.append(span)
        covered += span
        span = min(span * 2, FULL_BATCH * MAX_GROWTH)
    # The forwarder's own backlog path: one point per spooled batch, merged into wider windows until
    # they take the link at most COARSE_SECONDS, sent 64 points to a batch.
    # 24 h of distinct readings (a sample every 10 s stands in for every second here: a summary keeps
    # min/max/mean/last, whose size does not depend on how many samples a window held)
    day = samples_at(len(spans) * 48, interval=10.0)
    points = [(summarize(day[k * 48 : (k + 1) * 48]), span) for k, span in enumerate(spans)]
    adaptive = Adaptive("bench-node", "b" * 32, LinkMeter(None), FULL_BATCH)
    coarse_points = adaptive._coarsen("bench-node", "b" * 32, points, LINK)
    one_each = sum(
        len(encode_summary("bench-node", "b" * 32, [p for p, _ in points[i : i + 64]], 480)) + FRAMING
        for i in range(0, len(points), 64)
    )
    coarse = sum(
        len(encode_summary("bench-node", "b" * 32, [p for p, _ in coarse_points[i : i + 64]], 480)) + FRAMING
        for i in range(0, len(coarse_points), 64)
    )
    full_24h = outage_full * GPUS * 86400
    need = full * GPUS
    print(
        f"  24 h outage: {len(spans)} spooled batches, {full_24h / 1e6:.1f} MB at full resolution; a summary "
        f"point each: {one_each / 1e3:.0f} kB; merged to fit {COARSE_SECONDS:.0f} s of a {LINK:.0f} B/s link: "
        f"{len(coarse_points)} points of {86400 / len(coarse_points) / 60:.0f} min, {coarse / 1e3:.0f} kB"
    )
    print(
        f"  on a {LINK:.0f} B/s link (full resolution needs {need:.0f} B/s): the whole outage coarse after "
        f"{coarse / LINK:.0f} s; complete after {full_24h / (LINK - need) / 3600:.1f} h. Baseline (full "
        f"resolution only, oldest first): the outage's first hour after "
        f"{outage_full * GPUS * 3600 / (LINK - need) / 60:.0f} min, its last hour after the same 2 h"
    )


# ------------------------------------------------------------------------------------------- live


class Rig:
    """Mosquitto, a bridge, VictoriaMetrics, and the forwarder of 8 simulated GPUs behind a shaped link."""

    def __init__(self, tmp: Path, rate: float | None) -> None:
        self.tmp = tmp
        self.rate = rate
        self.node = f"bench-{uuidlib.uuid4().hex[:8]}"

    def __enter__(self) -> Rig:
        self.broker = MosquittoServer(self.tmp / "mqtt")
        self.broker.start()
        self.tsdb = VictoriaMetricsServer(self.tmp / "vm")
        self.tsdb.start()
        self.wan = TcpProxy(("127.0.0.1", self.broker.port)).start()
        if self.rate:
            self.wan.shape(rate=self.rate, latency=0.05)
        self.collector = Collector(self.broker).__enter__()  # type: ignore[arg-type]
        self.bridge = BridgeProcess(self.tmp, self.broker, self.tsdb.write_url, "bench-bridge").start()
        self.ring = RingBuffer(100_000)
        self.registry = CollectorRegistry()
        config = cfg.load(
            {
                "mqtt.url": f"mqtt://127.0.0.1:{self.wan.port}",
                "node-name": self.node,
                "spool.dir": str(self.tmp / "spool"),
                "mqtt.batch-interval": f"{BATCH}s",
                "mqtt.reconnect-max-delay": "500ms",
            },
            environ={},
        )
        self.forwarder = Forwarder(config, self.ring, self.registry)
        self.sampler = Sampler(self.ring).__enter__()
        self.forwarder.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.forwarder.stop(5)
        self.sampler.__exit__()
        self.bridge.stop()
        self.collector.__exit__()
        self.wan.stop()
        self.tsdb.stop()
        self.broker.stop()

    def stored(self, name: str) -> list[tuple[int, float]]:
        sensor = ',sensor="gpu"' if name.startswith("gpu_temperature_celsius") else ""
        found = self.tsdb.samples(f'{name}{{node="{self.node}",gpu="0"{sensor}}}')
        return sorted(p for points in found.values() for p in points)

    def gauge(self, name: str) -> float:
        return self.registry.get_sample_value(name) or 0.0


def fresh_once(rate: float | None) -> float:
    """Batch intervals from the spike's last sample until the TSDB shows it (a max, or the raw sample)."""
    with tempfile.TemporaryDirectory() as tmp, Rig(Path(tmp), rate) as rig:
        if rate:
            wait_until(lambda: rig.gauge("gpu_exporter_forward_summarizing") == 1, 60, "summaries")
        else:
            wait_until(lambda: rig.gauge("gpu_exporter_forward_published_batches_total") >= 2, 30, "batches")
        time.sleep(BATCH * (2 + random.random()))  # a steady state, and the spike at any phase of a batch
        rig.sampler.spike(3)
        wait_until(lambda: len(rig.sampler.spiked) == 3, 5, "the spike")
        last = rig.sampler.spiked[-1]
        name = "gpu_temperature_celsius_max" if rate else "gpu_temperature_celsius"
        stamp = round(last.timestamp * 1000)
        wait_until(lambda: any(t >= stamp and v == 95.0 for t, v in rig.stored(name)), 60, "the spike stored")
        return (time.time() - last.timestamp) / BATCH


def bench_fresh(runs: int) -> None:
    base = [fresh_once(None) for _ in range(runs)]
    weak = [fresh_once(3200 * 2 / 3) for _ in range(runs)]  # full resolution needs ~3.2 kB/s here
    print(
        f"  fresh data to the TSDB, median of {runs}: baseline (raw, unshaped link) "
        f"{statistics.median(base):.2f} batch intervals; 200 B/s-equivalent link, as a summary's max "
        f"{statistics.median(weak):.2f} batch intervals ({statistics.median(weak) * FULL_BATCH:.0f} s at "
        f"30 s batches); runs {[round(x, 2) for x in weak]}"
    )


def outage_once(rate: float, outage: float = 20.0) -> tuple[float, float]:
    """Seconds from reconnect until the outage's first quarter shows (as summaries or raw), and until
    every raw sample of it is stored (scaled)."""
    with tempfile.TemporaryDirectory() as tmp, Rig(Path(tmp), rate) as rig:
        wait_until(lambda: rig.gauge("gpu_exporter_forward_published_batches_total") >= 3, 30, "batches")
        time.sleep(2)
        rig.wan.cut()
        start = time.time()
        time.sleep(outage)
        end = time.time()
        taken = rig.sampler.seq
        expected = {t for seq, t in list(rig.sampler.stamps.items()) if seq <= taken}
        rig.wan.restore()
        back = time.time()
        span = (round(start * 1000), round(end * 1000))

        def coarse() -> bool:
            for name in ("gpu_temperature_celsius_max", "gpu_temperature_celsius"):
                stamps = [t for t, _ in rig.stored(name) if span[0] <= t <= span[1]]
                if stamps and min(stamps) - span[0] < outage * 1000 / 4:
                    return True
            return False

        wait_until(coarse, 120, "coarse")
        seen = time.time() - back
        wait_until(lambda: expected <= {t for t, _ in rig.stored("gpu_temperature_celsius")}, 180, "complete")
        return seen, time.time() - back


def bench_outage(runs: int) -> None:
    for ratio in (1.9, 6.25):
        results = [outage_once(3200 * ratio) for _ in range(runs)]
        coarse = statistics.median(r[0] for r in results)
        full = statistics.median(r[1] for r in results)
        print(
            f"  20 s outage (200 samples), link {ratio}x what full resolution needs, median of {runs}: "
            f"visible after {coarse:.1f} s, complete after {full:.1f} s (x{SCALE:.0f} at full scale)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", choices=["bytes", "fresh", "outage"])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.only in (None, "bytes"):
        print("bytes:")
        bench_bytes()
    if args.only in (None, "fresh"):
        print("fresh:")
        bench_fresh(args.runs)
    if args.only in (None, "outage"):
        print("outage:")
        bench_outage(args.runs)


if __name__ == "__main__":
    main()
