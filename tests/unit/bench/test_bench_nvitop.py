"""bench_nvitop.py's parts that decide what its figures mean: the library both exporters load (what the
real pynvml reads through it), the medians and ratios of its table, and its options.

The bench itself runs both exporters for minutes in real time; its figures are printed, never asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support import paths

sys.path.insert(0, str(paths.ROOT / "bench"))

from bench_nvitop import median_run, table
from nvitop_rig import GPUS, MIG, PROCESSES, Run, library, nvitop, ours

# what a process sees through pynvml in the bench's environment
READ = """\
import json
import pynvml

pynvml.nvmlInit()
seen = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    migs = []
    if pynvml.nvmlDeviceGetMigMode(h)[0]:
        for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                migs.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, slot))
            except pynvml.NVMLError_NotFound:
                pass
    seen.append({
        "processes": len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        "mig": [len(pynvml.nvmlDeviceGetComputeRunningProcesses(m)) for m in migs],
    })
print(json.dumps(seen))
"""


def run(**figures: float) -> Run:
    base = dict.fromkeys(Run.__dataclass_fields__, 1.0)
    return Run(**{**base, **figures})  # type: ignore[arg-type]


def test_both_exporters_read_the_same_gpus_mig_instances_and_processes_through_the_real_pynvml(
    tmp_path: Path,
) -> None:
    env = library(tmp_path, pcie_ms=20)
    for exporter in (ours(env), nvitop(env, tmp_path / "venv", "1.7.2")):
        assert exporter.env["LD_LIBRARY_PATH"] == str(tmp_path)
        assert {k: v for k, v in exporter.env.items() if k.startswith("FAKE_NVML_")} == {
            k: v for k, v in env.items() if k.startswith("FAKE_NVML_")
        }
    done = subprocess.run(
        [sys.executable, "-c", READ], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen) == GPUS
    assert seen[0] == {"processes": 0, "mig": [PROCESSES] * MIG}  # a MIG parent's processes are its instances'
    assert all(gpu == {"processes": PROCESSES, "mig": []} for gpu in seen[1:])


def test_the_medians_are_taken_figure_by_figure() -> None:
    runs = [run(gzip_p99=0.010, cpu=3.0), run(gzip_p99=0.002, cpu=1.0), run(gzip_p99=0.004, cpu=9.0)]
    median = median_run(runs)
    assert (median.gzip_p99, median.cpu) == (0.004, 3.0)  # from different runs


def test_the_table_gives_theirs_over_ours() -> None:
    text = table(("gpu-exporter", "nvitop-exporter"), (run(gzip_p99=0.002, rss=30.0), run(gzip_p99=0.1, rss=45.0)))
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}
    assert rows["scrape p99, 4 clients, gzip"] == "| scrape p99, 4 clients, gzip | 2.00 ms | 100.00 ms | 50.0x |"
    assert rows["RSS"] == "| RSS | 30.0 MiB | 45.0 MiB | 1.5x |"


def test_bad_options_end_in_one_line_and_exit_2() -> None:
    bench = paths.ROOT / "bench" / "bench_nvitop.py"
    for bad in (["--runs", "0"], ["--pcie-ms", "-1"], ["--cpu-seconds", "x"]):
        done = subprocess.run([sys.executable, str(bench), *bad], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("bench_nvitop.py: error:"), done.stderr
