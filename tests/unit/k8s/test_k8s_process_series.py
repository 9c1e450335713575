"""Per-process series (opt-in): memory and utilization per GPU process with pid, process name and its
pod, capped per GPU at the top N by memory, the rest counted; nothing of it without the option."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_exporter.k8s import PodAttributor
from gpu_exporter.k8s.processes import ProcessSeries, top_processes
from gpu_exporter.model import ProcessUsage, Sample
from gpu_exporter.ring import RingBuffer
from tests.unit.k8s.test_k8s_attribution import (
    EXPECTED_FALLBACK,
    FIXTURES,
    GPU0,
    GiB,
    _config,
    _device,
    _fallback_sample,
    _sample,
)

TRAINER_0 = 'namespace="ml",pod="trainer-0",container="trainer",pod_uid="1a2b3c4d-0000-4000-8000-000000000001"'
HOST = 'namespace="",pod="",container="",pod_uid=""'


def _lines(text: str, family: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(family + "{")]


def test_off_by_default_the_page_is_unchanged() -> None:
    attributor = PodAttributor(_config(), RingBuffer(8))
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    assert attributor.text() == EXPECTED_FALLBACK.read_text(encoding="utf-8")
    assert "gpu_process_" not in attributor.text()


def test_processes_get_their_series_with_pid_name_and_pod() -> None:
    registry = CollectorRegistry()
    config = dataclasses.replace(_config(), processes_series=True)
    attributor = PodAttributor(config, RingBuffer(8), registry)
    attributor.process([_fallback_sample(1, 1000.0)])
    memory = _lines(attributor.text(), "gpu_process_memory_used_bytes")
    assert (
        f'gpu_process_memory_used_bytes{{gpu="0",uuid="GPU-aaaa",pid="1001",process_name="python3",{TRAINER_0}}} 4294967296'
        in memory
    )
    # Xorg is the host's: its series has empty pod labels
    assert (
        f'gpu_process_memory_used_bytes{{gpu="0",uuid="GPU-aaaa",pid="1005",process_name="Xorg",{HOST}}} 104857600'
        in memory
    )
    # the transcoder's process reports neither memory nor utilization: no series for it
    assert not any('pid="1003"' in line for line in attributor.text().splitlines() if line.startswith("gpu_process"))
    util = _lines(attributor.text(), "gpu_process_utilization_ratio")
    assert (
        f'gpu_process_utilization_ratio{{gpu="0",uuid="GPU-aaaa",pid="1001",process_name="python3",{TRAINER_0}}} 0.6'
        in util
    )
    assert "gpu_exporter_process_series_cut 0.0" in generate_latest(registry).decode()


def test_four_thousand_processes_on_one_gpu_give_n_series_and_the_rest_counted() -> None:
    """Issue 33's case: 4,000 processes on a GPU gave a series each (and per-pod series by the thousand)."""
    registry = CollectorRegistry()
    config = dataclasses.replace(_config(), processes_series=True, processes_series_max=5)
    attributor = PodAttributor(config, RingBuffer(8), registry)
    processes = [ProcessUsage(100_000 + i, float(i * 1024), 0.0) for i in range(4000)]
    attributor.process([_sample(1, 1000.0, _device(GPU0, 100.0, *processes))])
    memory = _lines(attributor.text(), "gpu_process_memory_used_bytes")
    assert [line.split('pid="')[1].split('"')[0] for line in memory] == [
        str(100_000 + i) for i in range(3999, 3994, -1)
    ]
    assert len(_lines(attributor.text(), "gpu_process_utilization_ratio")) == 5
    assert "gpu_exporter_process_series_cut 3995.0" in generate_latest(registry).decode()


def test_ranking_by_memory_unknown_last_ties_by_pid() -> None:
    processes = [ProcessUsage(9, None, 0.5), ProcessUsage(3, GiB), ProcessUsage(2, GiB), ProcessUsage(5, 2 * GiB)]
    kept, cut = top_processes(processes, 3)
    assert [p.pid for p in kept] == [5, 2, 3] and cut == 1


def test_without_pod_attribution_the_series_have_empty_pod_labels() -> None:
    series = ProcessSeries(str(FIXTURES / "proc"), 10)
    series.update(Sample(1, 1000.0, (_device(GPU0, None, ProcessUsage(1001, 1e9, 0.25)),)))
    assert series.text().splitlines()[-1] == (
        f'gpu_process_utilization_ratio{{gpu="0",uuid="GPU-aaaa",pid="1001",process_name="python3",{HOST}}} 0.25'
    )


def test_page_with_process_series_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    attributor = PodAttributor(dataclasses.replace(_config(), processes_series=True), RingBuffer(8))
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    result = subprocess.run(
        [promtool, "check", "metrics"], input=attributor.text(), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
