"""/metrics under a wrong-password flood: the share of authenticated scrapes answered, and how long a
wrong password takes for a known and for an unknown user.

The real exporter process (simulated GPUs, ``--gpu-vendor=fake``) with a web config holding one user
whose bcrypt hash has cost 12; the flood (tests/support/web_flood.py) is a child process of ``--clients`` threads,
each a keep-alive HTTP client sending a fresh random wrong password for that user as fast as it is
answered; beside it, Prometheus-style scrapes with the right password every second on a fresh connection
(10 s timeout). The first scrape of each run comes during the flood, against a fresh exporter: its
password has not been checked yet. Then, without a flood, wrong passwords for the known user and for an
unknown one, alternated, each answer timed. Medians over ``--runs`` runs.

    python bench/bench_auth_flood.py [--clients 80] [--seconds 20] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

import bcrypt  # noqa: E402
from tests.support import child_env, exporter_cmd, free_port, http_get, stop_process  # noqa: E402
from tests.support.web_flood import flood, queued_checks, wrong_password_times  # noqa: E402

PASSWORD = "right-password-for-the-bench"


def start_exporter(work: Path, web: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    log = open(work / f"exporter-{port}.log", "wb")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        exporter_cmd(
            "--gpu-vendor=fake",
            "--fake.gpus=8",
            "--gpu-metrics-collection-interval=1s",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={web}",
            *extra,
        ),
        env=child_env(),
        stdout=log,
        stderr=log,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if http_get(f"http://127.0.0.1:{port}/readyz", timeout=1)[0] == 200:
                return proc, port
        except OSError:
            pass
        time.sleep(0.1)
    stop_process(proc)
    raise SystemExit(f"exporter did not start: {(work / f'exporter-{port}.log').read_text()[-2000:]}")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=80)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cost", type=int, default=12)
    parser.add_argument("--probes", type=int, default=8, help="timed wrong passwords per user and run")
    parser.add_argument("--args", default="", help="more exporter flags, space-separated")
    args = parser.parse_args()
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(args.cost)).decode()
    print(f"load average before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    shares, latencies, known_med, unknown_med = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        work = Path(tmp)
        web = work / "web.yml"
        web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        for run in range(args.runs):
            proc, port = start_exporter(work, web, args.args.split())
            try:
                cpu0 = cpu_seconds(proc.pid)
                result = flood(port, PASSWORD, clients=args.clients, seconds=args.seconds, every=1.0)
                cpu = cpu_seconds(proc.pid) - cpu0
                for _ in range(60):  # the flood's last checks finish
                    if queued_checks(port, "prometheus", PASSWORD) == 0:
                        break
                    time.sleep(0.5)
                times = wrong_password_times(port, ["prometheus", f"nobody-{run}"], args.probes)
                known, unknown = times["prometheus"], times[f"nobody-{run}"]
            finally:
                stop_process(proc, timeout=15)
            shares.append(result.answered)
            latencies.extend(t for code, t in result.scrapes if code == 200)
            known_med.append(statistics.median(known))
            unknown_med.append(statistics.median(unknown))
            print(f"run {run + 1}: {result.summary()}; exporter CPU {cpu:.1f} s")
            print(
                f"run {run + 1}: wrong password, known user median {known_med[-1] * 1000:.0f} ms "
                f"(min {min(known) * 1000:.0f}, max {max(known) * 1000:.0f}); unknown user median "
                f"{unknown_med[-1] * 1000:.0f} ms (min {min(unknown) * 1000:.0f}, max {max(unknown) * 1000:.0f})"
            )
    k, u = statistics.median(known_med), statistics.median(unknown_med)
    print(
        f"\nscrapes answered during a {args.clients}-client wrong-password flood (bcrypt cost {args.cost}): "
        f"median {100 * statistics.median(shares):.0f} % over {args.runs} runs (each: {[round(100 * s) for s in shares]} %); "
        f"answered scrapes' latency median {statistics.median(latencies or [0]):.3f} s, max {max(latencies or [0]):.3f} s"
    )
    print(
        f"wrong password: known user {k * 1000:.0f} ms, unknown user {u * 1000:.0f} ms "
        f"(unknown/known {u / k:.2f}; target within 25 %)"
    )
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
