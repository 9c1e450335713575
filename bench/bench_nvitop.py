"""This exporter against nvitop-exporter, both through the real nvidia-ml-py over the C libnvidia-ml.so.1.

Both read 8 GPUs + 7 MIG instances (2 compute processes on each) from tests/fakes/fake_nvml.c, compiled
into a temporary folder and loaded by pynvml as the driver's library (``LD_LIBRARY_PATH``): the
production code path of each, process listing included (bench/nvitop_rig.py). nvitop-exporter is
installed from PyPI with pip into its own virtual environment (under --cache, by default
~/.cache/gpu-exporter-bench/nvitop-exporter-<version>), never into this project's environment. It also
serves host series (CPU, memory, disks, network) that this exporter leaves to node_exporter.

Runs are interleaved (ours, theirs, ours, theirs, ...), one process each, at a 1 s collection interval:
  * CPU (% of one core) over --cpu-seconds, one gzip scrape every 15 s (as Prometheus), and RSS after;
  * then scrape latency with 4 concurrent keep-alive clients for --scrape-seconds asking for gzip (as
    Prometheus does), then as long without gzip.
Prints each run, then the medians over the completed runs and the ratios; the load average before each
pair. A run whose exporter exits on its own is reported with its last line and left out of the medians;
each run's output is kept under --logs.

Usage: python bench/bench_nvitop.py [--runs 5] [--scrape-seconds 8] [--cpu-seconds 20] [--pcie-ms 20]
       [--version 1.7.2] [--cache DIR] [--logs DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from nvitop_rig import GPUS, MIG, PROCESSES, Run, RunFailed, library, measure, nvitop, nvitop_venv, ours

NVITOP_VERSION = "1.7.2"


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def line(name: str, run: Run) -> str:
    failed = f", {run.gzip_failed + run.plain_failed} unanswered" if run.gzip_failed + run.plain_failed else ""
    return (
        f"{name:24} gzip p50 {run.gzip_p50 * 1e3:7.2f} p99 {run.gzip_p99 * 1e3:7.2f} ms ({run.gzip_scrapes:>5})  "
        f"plain p50 {run.plain_p50 * 1e3:7.2f} p99 {run.plain_p99 * 1e3:7.2f} ms ({run.plain_scrapes:>5}{failed})  "
        f"CPU {run.cpu:5.2f} %  RSS {run.rss:5.1f} MiB  {run.scrape_cpu * 1e3:6.2f} ms CPU/scrape"
    )


def median_run(runs: list[Run]) -> Run:
    """Each figure's median over ``runs`` (figure by figure: not one of the runs)."""
    fields = Run.__dataclass_fields__
    return Run(**{name: statistics.median(getattr(r, name) for r in runs) for name in fields})


def table(names: tuple[str, str], medians: tuple[Run, Run]) -> str:
    """The comparison as a Markdown table: the medians of both, and theirs over ours."""
    a, b = medians

    def ms(x: float) -> str:
        return f"{x * 1e3:.2f} ms"

    rows = [
        ("scrape p50, 4 clients, gzip", ms(a.gzip_p50), ms(b.gzip_p50), b.gzip_p50 / a.gzip_p50),
        ("scrape p99, 4 clients, gzip", ms(a.gzip_p99), ms(b.gzip_p99), b.gzip_p99 / a.gzip_p99),
        ("scrape p50, 4 clients, no gzip", ms(a.plain_p50), ms(b.plain_p50), b.plain_p50 / a.plain_p50),
        ("scrape p99, 4 clients, no gzip", ms(a.plain_p99), ms(b.plain_p99), b.plain_p99 / a.plain_p99),
        ("exporter CPU per scrape (gzip)", ms(a.scrape_cpu), ms(b.scrape_cpu), b.scrape_cpu / a.scrape_cpu),
        ("CPU, 1 s interval, % of one core", f"{a.cpu:.2f} %", f"{b.cpu:.2f} %", b.cpu / max(a.cpu, 1e-9)),
        ("RSS", f"{a.rss:.1f} MiB", f"{b.rss:.1f} MiB", b.rss / a.rss),
        ("page, uncompressed / gzip", f"{a.page / 1024:.0f} / {a.page_gzip / 1024:.0f} KiB",
         f"{b.page / 1024:.0f} / {b.page_gzip / 1024:.0f} KiB", b.page / a.page),
        ("series on the page", f"{a.series:.0f}", f"{b.series:.0f}", b.series / a.series),
    ]  # fmt: skip
    out = [f"| figure | {names[0]} | {names[1]} | theirs / ours |", "|---|---|---|---|"]
    out += [f"| {label} | {x} | {y} | {ratio:.1f}x |" for label, x, y, ratio in rows]
    unanswered = (a.gzip_failed + a.plain_failed, b.gzip_failed + b.plain_failed)
    out.append(f"| scrapes without an answer, per run | {unanswered[0]:g} | {unanswered[1]:g} | |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each exporter (default %(default)s)")
    parser.add_argument("--scrape-seconds", type=float, default=8, help="per latency phase (default %(default)s)")
    parser.add_argument("--cpu-seconds", type=float, default=20, help="CPU and RSS window (default %(default)s)")
    parser.add_argument("--pcie-ms", type=int, default=20, help="ms per PCIe throughput call (default %(default)s)")
    parser.add_argument("--version", default=NVITOP_VERSION, help="nvitop-exporter version (default %(default)s)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpu-exporter-bench",
        help="where nvitop-exporter's virtual environment is kept (default %(default)s)",
    )
    parser.add_argument("--logs", type=Path, help="where each run's output is kept (default: CACHE/logs)")
    args = parser.parse_args()
    if args.runs < 1 or args.scrape_seconds <= 0 or args.cpu_seconds <= 0 or args.pcie_ms < 0:
        parser.error("--runs, --scrape-seconds and --cpu-seconds must be positive, --pcie-ms not negative")
    venv = nvitop_venv(args.cache, args.version)
    args.logs = args.logs or args.cache / "logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    print(
        f"real nvidia-ml-py over tests/fakes/fake_nvml.c: {GPUS} GPUs + {MIG} MIG instances, {PROCESSES} processes "
        f"each, {args.pcie_ms} ms per PCIe throughput call; 1 s interval; {args.runs} interleaved runs; "
        f"CPU over {args.cpu_seconds:g} s; latency: 4 clients, {args.scrape_seconds:g} s gzip then plain",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-nvitop-") as tmp:
        env = library(Path(tmp), args.pcie_ms)
        exporters = (ours(env), nvitop(env, venv, args.version))
        runs: tuple[list[Run], list[Run]] = ([], [])
        failures: list[str] = []
        for i in range(args.runs):
            print(f"run {i + 1}: load average {load()}", flush=True)
            for n, (exporter, done) in enumerate(zip(exporters, runs, strict=True)):
                log = args.logs / f"{'ours' if n == 0 else 'nvitop'}-{i + 1}.log"
                try:
                    done.append(measure(exporter, log, args.cpu_seconds, args.scrape_seconds))
                except RunFailed as exc:
                    failures.append(f"{exporter.name}, run {i + 1}: {exc}")
                    print(f"  {exporter.name:24} run failed: {exc}", flush=True)
                    continue
                print("  " + line(exporter.name, done[-1]), flush=True)
    print(f"load average after: {load()}")
    if not all(runs):
        print("no comparison: an exporter completed no run", file=sys.stderr)
        return 1
    print(f"medians of {len(runs[0])} and {len(runs[1])} completed runs:")
    print(table((exporters[0].name, exporters[1].name), (median_run(runs[0]), median_run(runs[1]))))
    for failure in failures:
        print(f"failed: {failure}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
