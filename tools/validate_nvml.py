"""Check the NVML backend against nvidia-smi on a machine with a real NVIDIA GPU.

Reads one sample through the exporter's NVML backend and, at the same moment, runs
``nvidia-smi --query-gpu``; compares the values that both report, checks that GPM and the XID event
thread are wired, renders the page through promtool, and writes a Markdown report.

Usage: python tools/validate_nvml.py [--out docs/validation/REPORT.md]
Exit status 0 when every compared value agrees within its tolerance.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from gpu_exporter.backends.nvml import NvmlBackend  # noqa: E402
from gpu_exporter.config import Config  # noqa: E402
from gpu_exporter.exposition import native_view, render  # noqa: E402
from gpu_exporter.model import Sample  # noqa: E402

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        print("validate: nvidia-smi not found: run this on a machine with an NVIDIA driver", file=sys.stderr)
        return 2
    backend = NvmlBackend(Config(), xid_wait_ms=200)
    backend.open()
    lines = [f"# NVML validation, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", ""]
    failures = 0
    try:
        backend.read()  # primes GPM
        time.sleep(1.0)
        fields = list(FIELDS)
        query = subprocess.run(
            [smi, f"--query-gpu=uuid,{','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        devices = backend.read()
        smi_values = parse_smi(query.stdout, fields)
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
            theirs = smi_values.get(ds.device.uuid, {})
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
        xid_alive = backend._xid_thread is not None and backend._xid_thread.is_alive()
        lines.append(f"XID event thread running: {xid_alive}")
        page = render(Sample(1, time.time(), tuple(devices)), native_view())
        tool = shutil.which("promtool")
        if tool:
            check = subprocess.run([tool, "check", "metrics"], input=page, capture_output=True, text=True)
            lines.append(
                f"promtool check metrics: {'clean' if not (check.stdout + check.stderr).strip() else check.stdout + check.stderr}"
            )
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
