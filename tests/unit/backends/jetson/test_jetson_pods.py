"""Jetson GPU processes and pods on a KubeEdge node: no NVML, no pod-resources socket.

The fixture trees hold running "pods": processes with the GPU's device nodes open under proc/<pid>/fd,
their cgroups, the kubelet's log directories, and nvmap's per-client table. The real backend finds the
processes, and the real attribution thread's code names their pods.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.backends.jetson import backend as jetson
from gpu_exporter.backends.jetson import procs as jetson_procs
from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor
from gpu_exporter.model import Sample
from gpu_exporter.ring import RingBuffer
from tests.support import paths

FIXTURES = paths.FIXTURES / "jetson"
KiB = 1024


def config_for(root: Path, **extra: object) -> Config:
    return Config(
        path_sysfs=str(root / "sys"),
        path_procfs=str(root / "proc"),
        k8s_pod_attribution=True,
        k8s_pod_logs_path=str(root / "var" / "log" / "pods"),
        k8s_kubelet_socket=str(root / "no-kubelet.sock"),  # KubeEdge: EdgeCore creates none
        **extra,  # type: ignore[arg-type]
    )


def pod_series(root: Path, timestamps: tuple[float, ...] = (1000.0,), **extra: object) -> dict[str, float]:
    config = config_for(root, **extra)
    backend = jetson.create(config)
    backend.open()
    attributor = PodAttributor(config, RingBuffer(8))
    attributor.process([Sample(seq, ts, tuple(backend.read())) for seq, ts in enumerate(timestamps, 1)])
    out = {}
    for line in attributor.text().splitlines():
        if not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            assert re.search(r',pod_uid="[0-9a-f-]{36}"}$', name), name  # from the process's cgroup
            out[re.sub(r',pod_uid="[^"]*"', "", name)] = float(value)  # the series by name, the UID aside
    return out


def test_gpu_processes_are_those_holding_the_gpu_device_nodes() -> None:
    found = jetson_procs.scan(FIXTURES / "orin-jp6" / "proc")
    # nvargus-daemon holds only /dev/nvmap and nvhost-ctrl, nginx nothing: not GPU processes
    assert found.pids == (1500, 2101, 2205, 2206)
    assert jetson_procs.scan(FIXTURES / "xavier-jp4" / "proc").pids == (3310, 3420, 3421)


@pytest.mark.parametrize(
    "target, gpu",
    [
        ("/dev/nvgpu/igpu0/ctrl", True),
        ("/dev/nvhost-ctrl-gpu", True),
        ("/dev/nvhost-as-gpu", True),
        ("/dev/nvhost-gpu", True),
        ("/dev/nvhost-nvdec", False),
        ("/dev/nvhost-ctrl", False),
        ("/dev/nvmap", False),
        ("/home/user/nvhost-gpu", False),
        ("socket:[1234]", False),
    ],
)
def test_gpu_device_nodes(target: str, gpu: bool) -> None:
    assert jetson_procs.is_gpu_node(target) is gpu


def test_orin_jp6_pods_get_their_series_with_nvmap_memory() -> None:
    series = pod_series(FIXTURES / "orin-jp6")
    base = 'gpu="0",uuid="jetson-1424623045678"'
    detector = f'{base},namespace="video",pod="analytics-0",container="detector"'
    tracker = f'{base},namespace="video",pod="tracker-5d8f9",container="tracker"'
    assert series[f"gpu_pod_info{{{detector}}}"] == 1
    assert series[f"gpu_pod_info{{{tracker}}}"] == 1
    assert series[f"gpu_pod_memory_used_bytes{{{detector}}}"] == 262144 * KiB
    assert series[f"gpu_pod_memory_used_bytes{{{tracker}}}"] == (65536 + 32768) * KiB  # its two processes
    assert len([k for k in series if k.startswith("gpu_pod_info")]) == 2  # Xorg is the host's, nobody's
    # Orin has no rail of the GPU alone, so there is no power to split: no energy series
    assert not any(k.startswith("gpu_pod_energy") for k in series)


def test_xavier_jp4_energy_split_by_process_count() -> None:
    """No per-process load on a Jetson: the active energy is split evenly by process, as for AMD."""
    series = pod_series(FIXTURES / "xavier-jp4", (1000.0, 1005.0), k8s_idle_power=2.0)
    base = 'gpu="0",uuid="jetson-1421019098765",namespace="video"'
    active = (9.12 - 2.0) * 5  # the GPU rail's watts above idle, for 5 s
    detector = series[f'gpu_pod_energy_joules_total{{{base},pod="analytics-1",container="detector"}}']
    encoder = series[f'gpu_pod_energy_joules_total{{{base},pod="recorder-0",container="encoder"}}']
    assert detector == pytest.approx(active / 3)
    assert encoder == pytest.approx(active * 2 / 3)  # two processes
    assert series[f'gpu_pod_memory_used_bytes{{{base},pod="recorder-0",container="encoder"}}'] == (
        (131072 + 65536) * KiB
    )


def test_without_nvmap_accounting_pods_are_named_without_memory(tmp_path: Path) -> None:
    """A non-root agent cannot read debugfs: pods are still named, their memory is absent (not 0)."""
    root = tmp_path / "orin-jp6"
    shutil.copytree(FIXTURES / "orin-jp6", root, symlinks=True)
    shutil.rmtree(root / "sys" / "kernel" / "debug")
    series = pod_series(root)
    assert len([k for k in series if k.startswith("gpu_pod_info")]) == 2
    assert not any(k.startswith("gpu_pod_memory") for k in series)
    backend = jetson.create(config_for(root))
    backend.open()
    [sample] = backend.read()
    assert sample.values[("memory_used", ())] == 385024 * KiB  # NvMapMemUsed still says it
    assert ("processes_memory", ()) not in sample.values
    assert sample.values[("processes", ())] == 4


def test_nvmap_table_unreadable_is_none() -> None:
    assert jetson_procs.nvmap_clients(Path("/nonexistent")) is None


def test_nvmap_table_parsing(tmp_path: Path) -> None:
    table = tmp_path / "/".join(jetson_procs.NVMAP_CLIENTS)
    table.parent.mkdir(parents=True)
    table.write_text(
        "CLIENT PROCESS PID SIZE\nuser a b c 12 4K\nuser x 12 8K\nbroken line\nuser y zz 9K\ntotal 99K\n\x00\xff\n"
    )
    assert jetson_procs.nvmap_clients(tmp_path) == ({12: 12 * KiB}, 99 * KiB)


def test_scanner_reads_new_and_gpu_processes_each_cycle_and_quiet_ones_after_rescan(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "orin-jp6" / "proc", proc, symlinks=True)
    now = [0.0]
    scanner = jetson_procs.ProcessScanner(proc, rescan=30.0, clock=lambda: now[0])
    assert scanner.scan().pids == (1500, 2101, 2205, 2206)
    # nginx (2301) opens the GPU late: a quiet process is read again only after the rescan interval
    (proc / "2301" / "fd" / "9").symlink_to("/dev/nvgpu/igpu0/ctrl")
    # a new process is read at once; a GPU process that exits leaves at once
    shutil.copytree(proc / "2101", proc / "2500", symlinks=True)
    shutil.rmtree(proc / "2205")
    now[0] = 5.0
    assert scanner.scan().pids == (1500, 2101, 2206, 2500)
    now[0] = 31.0
    assert scanner.scan().pids == (1500, 2101, 2206, 2301, 2500)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.binary(max_size=400))
def test_nvmap_table_with_any_bytes_gives_sizes_or_nothing(tmp_path: Path, content: bytes) -> None:
    table = tmp_path / "/".join(jetson_procs.NVMAP_CLIENTS)
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_bytes(content)
    parsed = jetson_procs.nvmap_clients(tmp_path)
    assert parsed is not None
    by_pid, total = parsed
    assert all(pid >= 0 and size >= 0 for pid, size in by_pid.items())
    assert total is None or total >= 0
