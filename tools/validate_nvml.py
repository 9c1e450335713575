"""Check the NVML backend against nvidia-smi and the driver on a machine with a real NVIDIA GPU.

Reads samples through the exporter's NVML backend and, at the same moment, runs
``nvidia-smi --query-gpu``; compares the values that both report, checks that GPM and the XID event
thread are wired, renders the page through promtool, and writes a Markdown report. It also checks
what the backend relies on and a simulator cannot prove:
- slow calls: the calls this driver takes longer than the 5 ms budget over (PCIe throughput samples
  the link for ~20 ms) are remembered per GPU on pynvml's real handles (ctypes pointers, unhashable)
  and started early, so later cycles are shorter than the serial ones;
- violation counters (``nvmlDeviceGetViolationStatus``, served as ``gpu_clock_event_seconds_total``):
  one series per policy the driver supports and none for the others, never going back, growing no
  faster than time (nanoseconds), and equal to the driver's own reading.

Usage: python tools/validate_nvml.py [--out docs/validation/REPORT.md] [--timeout 120]
Exit status 0 when every check passes, 1 when one fails, 2 without nvidia-smi, 3 past the time limit.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpu_exporter.backends.nvidia.backend import NvmlBackend  # noqa: E402
from gpu_exporter.backends.nvidia.library import import_pynvml  # noqa: E402
from gpu_exporter.backends.nvidia.violation import VIOLATION_POLICIES  # noqa: E402
from gpu_exporter.config import Config  # noqa: E402
from gpu_exporter.exposition import native_view, render  # noqa: E402
from gpu_exporter.model import DeviceSample, Sample  # noqa: E402

# nvidia-smi field -> (catalog key, factor from nvidia-smi's unit to ours, absolute tolerance in our unit)
FIELDS = {
    "memory.total": ("memory_total", 1024**2, 1024**2),
    "memory.used": ("memory_used", 1024**2, 256 * 1024**2),
    "temperature.gpu": ("temp_gpu", 1.0, 3.0),
    "power.limit": ("power_limit", 1.0, 1.0),
    "clocks.max.sm": ("clock_max_sm", 1e6, 1e6),
    "clocks.max.memory": ("clock_max_memory", 1e6, 1e6),
    "pcie.link.width.current": ("pcie_link_width", 1.0, 0.0),
    "pcie.link.gen.current": ("pcie_link_generation", 1.0, 0.0),
    "power.draw": ("power", 1.0, 60.0),
    "utilization.gpu": ("utilization", 0.01, 0.35),
}
PCIE = "nvmlDeviceGetPcieThroughput"
SLOW_CYCLES = 3  # cycles read after the first two, when calls measured slow twice start early
TIME_SLACK = 0.05  # seconds a counter of time may run ahead of the wall clock between two reads


def parse_smi(text: str, fields: list[str]) -> dict[str, dict[str, float | None]]:
    """nvidia-smi CSV (noheader, nounits) keyed by UUID; '[N/A]' and 'N/A' become None."""
    out: dict[str, dict[str, float | None]] = {}
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        uuid, values = cells[0], cells[1:]
        parsed: dict[str, float | None] = {}
        for name, raw in zip(fields, values, strict=False):
            try:
                parsed[name] = float(raw)
            except ValueError:
                parsed[name] = None
        out[uuid] = parsed
    return out


def gpus(samples: list[DeviceSample]) -> list[DeviceSample]:
    return [s for s in samples if not s.device.is_mig and s.up]


def timed_read(backend: NvmlBackend, durations: list[float]) -> list[DeviceSample]:
    started = time.monotonic()
    samples = backend.read()
    durations.append(time.monotonic() - started)
    return samples


def check_slow_calls(nv: Any, backend: NvmlBackend, durations: list[float]) -> tuple[list[str], int]:
    """Report lines and failures: do the calls this driver makes slow leave the cycle?

    ``durations``: the seconds of every read so far, the first two serial (nothing is remembered
    before a call was slow in two cycles running), at least one more after them.
    """
    slow = backend.slow_calls
    budget = slow.budget or 0.0
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    try:
        hash(handle)
        hashable = "yes"
    except TypeError:
        hashable = "no (ctypes pointers: the backend keys calls by GPU index)"
    took = []
    for _ in range(2):
        started = time.monotonic()
        try:
            nv.nvmlDeviceGetPcieThroughput(handle, 0)
        except nv.NVMLError as exc:
            took.append(f"{exc}")
            break
        took.append(f"{(time.monotonic() - started) * 1000:.1f} ms")
    remembered = sorted({f"{name.rstrip(':')} (GPU {scope})" for scope, name, *_ in slow.slow()})
    serial, early = durations[:2], durations[2:]
    lines = [
        "## Slow calls",
        "",
        f"- pynvml device handles hashable: {hashable}",
        f"- {PCIE} on GPU 0, timed twice: {', '.join(took)} (budget {budget * 1000:.0f} ms)",
        f"- calls remembered as slow: {', '.join(remembered) or 'none'}",
        f"- calls started early: {slow.started_early}",
        f"- cycle seconds, serial then early: {' '.join(f'{d:.3f}' for d in serial)} | "
        f"{' '.join(f'{d:.3f}' for d in early)}",
    ]
    failures = 0
    pcie_slow = all(t.endswith(" ms") and float(t.split()[0]) / 1000 > budget for t in took)
    if pcie_slow and not any(name.startswith(PCIE) for name in remembered):
        lines.append(f"- FAIL: {PCIE} is slower than the budget but was not remembered")
        failures += 1
    if remembered and (slow.started_early == 0 or min(early) >= min(serial)):
        lines.append("- FAIL: calls are remembered as slow but the cycles that followed did not get shorter")
        failures += 1
    if not remembered and not pcie_slow:
        lines.append("- no call slower than the budget on this driver: nothing to start early")
    return [*lines, ""], failures


def check_violations(
    nv: Any, first: list[DeviceSample], second: list[DeviceSample], seconds: float
) -> tuple[list[str], int]:
    """Report lines and failures: ``gpu_clock_event_seconds_total`` against the driver's counters.

    ``first`` and ``second`` are two reads ``seconds`` apart; the driver is asked again after them.
    """
    lines = [
        "## Violation counters (nvmlDeviceGetViolationStatus)",
        "",
        "| GPU | policy | driver | exporter, first read (s) | second read (s) | growth per second | agrees |",
        "|---|---|---|---|---|---|---|",
    ]
    failures = 0
    before = {s.device.uuid: s.values for s in gpus(first)}
    for ds in gpus(second):
        handle = nv.nvmlDeviceGetHandleByIndex(int(ds.device.gpu))
        for policy, reason in VIOLATION_POLICIES:
            key = (f"clock_event_seconds_{reason}", ())
            a, b = before.get(ds.device.uuid, {}).get(key), ds.values.get(key)
            try:
                driver: float | None = int(nv.nvmlDeviceGetViolationStatus(handle, policy).violationTime) * 1e-9
                status = f"{driver:.3f} s"
            except nv.NVMLError as exc:
                driver, status = None, str(exc)
            if driver is None:
                ok = a is None and b is None
                lines.append(f"| {ds.device.gpu} | {reason} | {status} | {a} | {b} | - | {'yes' if ok else 'NO'} |")
            elif a is None or b is None:
                ok = False
                lines.append(f"| {ds.device.gpu} | {reason} | {status} | {a} | {b} | - | NO (series missing) |")
            else:
                rate = (b - a) / seconds
                ok = 0 <= b - a <= seconds + TIME_SLACK and b <= driver <= b + seconds + TIME_SLACK
                lines.append(
                    f"| {ds.device.gpu} | {reason} | {status} | {a:.3f} | {b:.3f} | {rate:.3f} | "
                    f"{'yes' if ok else 'NO'} |"
                )
            failures += 0 if ok else 1
    lines += [
        "",
        "A counter must not go back, may grow by at most the time between the reads (nanoseconds of "
        "throttling per nanosecond), and the driver, asked after the second read, must be at or "
        "slightly past it. A policy the driver does not support has no series.",
        "",
    ]
    return lines, failures


def compare_smi(devices: list[DeviceSample], smi: dict[str, dict[str, float | None]]) -> tuple[list[str], int]:
    lines: list[str] = []
    failures = 0
    for ds in devices:
        if ds.device.is_mig:
            continue
        lines += [
            f"## GPU {ds.device.gpu}: {ds.info.get('name', '?')} ({ds.device.uuid})",
            "",
            f"driver {ds.info.get('driver_version')}, CUDA {ds.info.get('cuda_version')}",
            "",
            "| nvidia-smi field | nvidia-smi | exporter | tolerance | agrees |",
            "|---|---|---|---|---|",
        ]
        theirs = smi.get(ds.device.uuid, {})
        for name, (key, factor, tolerance) in FIELDS.items():
            ours = ds.values.get((key, ()))
            raw = theirs.get(name)
            if raw is None and ours is None:
                verdict = "both absent"
            elif raw is None or ours is None:
                verdict, failures = "MISMATCH (one absent)", failures + 1
            else:
                ok = abs(raw * factor - ours) <= tolerance
                verdict = "yes" if ok else "NO"
                failures += 0 if ok else 1
            lines.append(f"| {name} | {raw} | {ours} | {tolerance:g} | {verdict} |")
        gpm = [k for (k, _) in ds.values if k in ("sm_active", "tensor_active", "dram_active")]
        lines += [
            "",
            f"GPM metrics present: {', '.join(sorted(gpm)) or 'none (device not supported)'}",
            f"XID counters present: {sum(1 for (k, _) in ds.values if k == 'xid_errors')}",
            "",
        ]
    return lines, failures


def watchdog(seconds: float) -> None:
    """End the process after ``seconds``, even while a driver call blocks (it holds no GIL)."""

    def expire() -> None:
        print(f"validate: not done after {seconds:g} s; stopped", file=sys.stderr, flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="", help="write the report to this file too")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds the whole run may take (%(default)s)")
    args = parser.parse_args()
    watchdog(args.timeout)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("validate: nvidia-smi not found: run this on a machine with an NVIDIA driver", file=sys.stderr)
        return 2
    nv = import_pynvml()
    backend = NvmlBackend(Config(), nvml=nv, xid_wait_ms=200)
    backend.open()
    lines = [f"# NVML validation, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", ""]
    failures = 0
    durations: list[float] = []
    try:
        first = timed_read(backend, durations)  # also primes GPM
        first_at = time.monotonic()
        time.sleep(1.0)
        fields = list(FIELDS)
        query = subprocess.run(
            [smi, f"--query-gpu=uuid,{','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        devices = timed_read(backend, durations)
        seconds = time.monotonic() - first_at
        found, failed = compare_smi(devices, parse_smi(query.stdout, fields))
        lines += found
        failures += failed
        found, failed = check_violations(nv, first, devices, seconds)
        lines += found
        failures += failed
        for _ in range(SLOW_CYCLES):
            timed_read(backend, durations)
        found, failed = check_slow_calls(nv, backend, durations)
        lines += found
        failures += failed
        lines.append(f"XID event thread running: {backend.xid_events_running}")
        page = render(Sample(1, time.time(), tuple(devices)), native_view())
        tool = shutil.which("promtool")
        if tool:
            check = subprocess.run([tool, "check", "metrics"], input=page, capture_output=True, text=True)
            found_text = (check.stdout + check.stderr).strip()
            lines.append(f"promtool check metrics: {found_text or 'clean'}")
            failures += 1 if found_text else 0
        lines.append(f"Errors by call: {dict(backend.errors) or 'none'}")
    finally:
        backend.close()
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
