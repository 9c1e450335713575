"""Costs behind the DaemonSet's resource requests: pod attribution per sample, and the running agent's
CPU and memory on simulated GPUs with attribution on. Prints medians of several runs. ``--hostile``
adds issue 33's node: 4,000 pod processes on one GPU (per-pod series capped), and the kubelet's List of
50,000 pods decoded (asked once per refresh interval, not per sample).

    python bench/bench_k8s.py [--gpus 8] [--seconds 20] [--hostile]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpu_exporter.config import Config  # noqa: E402
from gpu_exporter.k8s import PodAttributor  # noqa: E402
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, Sample  # noqa: E402
from gpu_exporter.ring import RingBuffer  # noqa: E402

CGROUP = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{cid}.scope\n"


def _tree(root: Path, gpus: int, per_gpu: int) -> None:
    for g in range(gpus):
        for p in range(per_gpu):
            n = g * per_gpu + p
            uid = f"{n:08x}-0000-4000-8000-000000000000"
            cid = f"{n:064x}"
            pid = 10000 + n
            (root / "proc" / str(pid)).mkdir(parents=True)
            (root / "proc" / str(pid) / "cgroup").write_text(CGROUP.format(uid=uid.replace("-", "_"), cid=cid))
            (root / "pods" / f"ns_pod-{n}_{uid}" / "main").mkdir(parents=True)


def bench_process(gpus: int, per_gpu: int, runs: int = 5, samples: int = 200) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _tree(root, gpus, per_gpu)
        config = Config(
            path_procfs=str(root / "proc"),
            k8s_pod_logs_path=str(root / "pods"),
            k8s_kubelet_socket=str(root / "none.sock"),
            k8s_idle_power=50.0,
        )
        times = []
        for _ in range(runs):
            attributor = PodAttributor(config, RingBuffer(4))
            batch = []
            for seq in range(1, samples + 1):
                devices = tuple(
                    DeviceSample(
                        DeviceId(str(g), f"GPU-{g}"),
                        True,
                        {("power", ()): 100.0 + seq % 7},
                        {},
                        tuple(ProcessUsage(10000 + g * per_gpu + p, 1e9, 0.2) for p in range(per_gpu)),
                    )
                    for g in range(gpus)
                )
                batch.append(Sample(seq, float(seq), devices))
            start = time.perf_counter()
            for sample in batch:
                attributor.process([sample])
            times.append((time.perf_counter() - start) / samples)
        return statistics.median(times)


def bench_hostile(processes: int = 4000, runs: int = 3, samples: int = 20) -> tuple[float, int]:
    """(ms per sample, per-pod series served) with ``processes`` pod processes on one GPU."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _tree(root, 1, processes)
        config = Config(
            path_procfs=str(root / "proc"),
            k8s_pod_logs_path=str(root / "pods"),
            k8s_kubelet_socket=str(root / "none.sock"),
            k8s_idle_power=50.0,
        )
        times, served = [], 0
        for _ in range(runs):
            attributor = PodAttributor(config, RingBuffer(4))
            procs = tuple(ProcessUsage(10000 + p, 1e6 * (p + 1), 0.0) for p in range(processes))
            batch = [
                Sample(
                    seq, float(seq), (DeviceSample(DeviceId("0", "GPU-0"), True, {("power", ()): 100.0}, {}, procs),)
                )
                for seq in range(1, samples + 1)
            ]
            attributor.process(batch[:1])  # the first sample reads every cgroup file: not the steady state
            start = time.perf_counter()
            for sample in batch[1:]:
                attributor.process([sample])
            times.append((time.perf_counter() - start) / (samples - 1))
            served = sum(1 for ln in attributor.text().splitlines() if not ln.startswith("#"))
        return statistics.median(times) * 1e3, served


def bench_list_decode(pods: int = 50_000, runs: int = 3) -> tuple[float, int]:
    """(ms to decode, bytes) of a pod-resources List of ``pods`` pods, one GPU each."""
    from tests.support.k8s_fakes import encode_response

    from gpu_exporter.k8s.podresources import decode_list_response

    data = encode_response(
        [(f"pod-{i}", "ns", [("main", [("nvidia.com/gpu", [f"GPU-{i % 8}::{i}"])])]) for i in range(pods)]
    )
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        decode_list_response(data)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, len(data)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_agent(gpus: int, seconds: float) -> tuple[float, float]:
    """(CPU millicores, RSS MiB) of the running agent at the default 5 s interval, attribution on."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    args = [
        sys.executable,
        "-m",
        "gpu_exporter",
        "--gpu-vendor=fake",
        f"--fake.gpus={gpus}",
        f"--web.listen-address=127.0.0.1:{_free_port()}",
        "--k8s.pod-attribution=true",
    ]
    child = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)  # start-up (imports) is not the steady state
        ticks = os.sysconf("SC_CLK_TCK")

        def cpu() -> float:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / ticks

        c0, t0 = cpu(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = cpu(), time.monotonic()
        rss = next(
            int(ln.split()[1])
            for ln in Path(f"/proc/{child.pid}/status").read_text().splitlines()
            if ln.startswith("VmRSS:")
        )
        return 1000 * (c1 - c0) / (t1 - t0), rss / 1024
    finally:
        child.terminate()
        child.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--hostile", action="store_true", help="also issue 33's 4,000-process GPU and 50,000-pod List")
    args = parser.parse_args()
    if args.hostile:
        sys.path.insert(0, str(ROOT))
        ms, served = bench_hostile()
        print(f"attribution: 1 GPU x 4000 pod processes: {ms:.1f} ms per sample, {served} per-pod series (median of 3)")
        ms, size = bench_list_decode()
        print(
            f"pod-resources List of 50000 pods ({size / 1e6:.1f} MB): decoded in {ms:.0f} ms, once per refresh interval"
        )
    for per_gpu in (1, 4):
        cost = bench_process(args.gpus, per_gpu)
        print(f"attribution: {args.gpus} GPUs x {per_gpu} pod processes: {cost * 1e3:.3f} ms per sample (median of 5)")
    runs = [bench_agent(args.gpus, args.seconds) for _ in range(3)]
    print(
        f"agent, {args.gpus} simulated GPUs, 5s interval, attribution on: "
        f"{statistics.median(r[0] for r in runs):.1f} millicores, "
        f"{statistics.median(r[1] for r in runs):.1f} MiB RSS (median of 3 x {args.seconds:g}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
