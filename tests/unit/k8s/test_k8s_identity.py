"""Which device and which process belong to a pod, where the identifiers are easy to confuse: MIG
compute instances that share a GPU instance, named by the device plugin's older ID form; and a Jetson
process whose PID comes back (a process that exits, and a new one given the same number)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter.backends.jetson import procs as jetson_procs
from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor
from gpu_exporter.k8s.podresources import device_matches
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.ring import RingBuffer
from tests.support import paths
from tests.support.k8s_fakes import FakeKubelet

FIXTURES = paths.FIXTURES
PARENT = "GPU-dddd"
# one GPU instance (1) split into two compute instances, and a second GPU instance (2)
CI0 = DeviceId("3", "MIG-aaaa", "1", "0", "1c.2g.20gb", PARENT)
CI1 = DeviceId("4", "MIG-bbbb", "1", "1", "1c.2g.20gb", PARENT)
GI2 = DeviceId("5", "MIG-cccc", "2", "0", "2g.20gb", PARENT)


@pytest.mark.parametrize(
    ("device_id", "device", "expected"),
    [
        ("MIG-GPU-dddd/1/0", CI0, True),
        ("MIG-GPU-dddd/1/1", CI0, False),  # same GPU instance, another compute instance
        ("MIG-GPU-dddd/1/1", CI1, True),
        ("MIG-GPU-dddd/1/0", CI1, False),
        ("MIG-GPU-dddd/2/0", GI2, True),
        ("MIG-GPU-dddd/1/0", GI2, False),
        ("MIG-GPU-eeee/1/0", CI0, False),  # another GPU
        ("MIG-GPU-dddd/1/0/7", CI0, False),
        ("MIG-GPU-dddd/1", CI0, False),
    ],
)
def test_older_mig_ids_name_the_gpu_instance_and_the_compute_instance(
    device_id: str, device: DeviceId, expected: bool
) -> None:
    assert device_matches(device_id, device) is expected


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.stop()


def test_pods_on_compute_instances_of_one_gpu_instance_get_their_own_device(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        ("infer-a", "serve", [("server", [("nvidia.com/mig-1c.2g.20gb", ["MIG-GPU-dddd/1/0"])])]),
        ("infer-b", "serve", [("server", [("nvidia.com/mig-1c.2g.20gb", ["MIG-GPU-dddd/1/1"])])]),
        ("trainer", "ml", [("main", [("nvidia.com/mig-2g.20gb", ["MIG-GPU-dddd/2/0"])])]),
    ]
    config = Config(
        interval=1.0,
        path_procfs=str(FIXTURES / "k8s" / "proc"),
        k8s_pod_attribution=True,
        k8s_pod_logs_path=str(FIXTURES / "k8s" / "var" / "log" / "pods"),
        k8s_kubelet_socket=kubelet.socket,
    )
    attributor = PodAttributor(config, RingBuffer(8))
    attributor.process([Sample(1, 1000.0, tuple(DeviceSample(d, True, {}, {}) for d in (CI0, CI1, GI2)))])
    owners: dict[str, set[str]] = {}
    for line in attributor.text().splitlines():
        if line.startswith("gpu_pod_info{"):
            uuid = re.search(r'\buuid="([^"]+)"', line)
            pod = re.search(r'\bpod="([^"]+)"', line)
            assert uuid and pod, line
            owners.setdefault(uuid.group(1), set()).add(pod.group(1))
    assert owners == {"MIG-aaaa": {"infer-a"}, "MIG-bbbb": {"infer-b"}, "MIG-cccc": {"trainer"}}


def test_a_jetson_pid_that_comes_back_holding_the_gpu_is_seen_at_once(tmp_path: Path) -> None:
    """nginx (PID 2301) runs without the GPU; it exits, and a CUDA process is given PID 2301 before the
    quiet-process rescan is due: the new process is read as new, not skipped as the old quiet one."""
    proc = tmp_path / "proc"
    shutil.copytree(FIXTURES / "jetson" / "orin-jp6" / "proc", proc, symlinks=True)
    now = [0.0]
    scanner = jetson_procs.ProcessScanner(proc, rescan=30.0, clock=lambda: now[0])
    assert 2301 not in scanner.scan().pids
    shutil.rmtree(proc / "2301")  # nginx exits
    now[0] = 5.0
    assert 2301 not in scanner.scan().pids
    shutil.copytree(proc / "2101", proc / "2301", symlinks=True)  # a GPU process takes the number
    now[0] = 10.0
    assert 2301 in scanner.scan().pids
