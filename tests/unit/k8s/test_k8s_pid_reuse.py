"""PID reuse in pod attribution: a PID that one pod's process held and another pod's process holds
later is attributed to the pod that holds it now, not to the one cached from before."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor, PodRef
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, Sample
from gpu_exporter.ring import RingBuffer
from tests.support import paths

FIXTURES = paths.FIXTURES / "k8s"
GPU0 = DeviceId("0", "GPU-aaaa")
TRAINER = PodRef("ml", "trainer-0", "trainer")
RESNET = PodRef("inference", "resnet-7f9c", "server")
PID = 1001  # trainer-0's process in the fixture tree


def _attributor(procfs: Path) -> PodAttributor:
    config = Config(
        interval=1.0,
        path_procfs=str(procfs),
        k8s_pod_attribution=True,
        k8s_pod_logs_path=str(FIXTURES / "var" / "log" / "pods"),
        k8s_kubelet_socket="/nonexistent/kubelet.sock",
        k8s_idle_power=50.0,
    )
    return PodAttributor(config, RingBuffer(8))


def _sample(seq: int, *pids: int) -> Sample:
    processes = tuple(ProcessUsage(pid, 1024**3, 0.5) for pid in pids)
    return Sample(seq, 1000.0 + seq, (DeviceSample(GPU0, True, {("power", ()): 200.0}, {}, processes),))


def test_a_reused_pid_is_attributed_to_the_pod_that_holds_it_now(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", procfs)
    attributor = _attributor(procfs)
    attributor.process([_sample(1, PID)])
    assert attributor.device_pods().get("GPU-aaaa") == (TRAINER,)

    # trainer-0's process exits (absent from a sample); the kernel hands its PID to resnet's new process.
    attributor.process([_sample(2)])
    assert attributor.device_pods().get("GPU-aaaa") == ()
    (procfs / str(PID) / "cgroup").write_text((procfs / "1002" / "cgroup").read_text())
    attributor.process([_sample(3, PID)])

    assert attributor.device_pods().get("GPU-aaaa") == (RESNET,)
    text = attributor.text()
    assert 'pod="resnet-7f9c"' in text
    assert 'pod="trainer-0"' not in text


def test_a_pid_whose_process_is_gone_names_no_pod(tmp_path: Path) -> None:
    procfs = tmp_path / "proc"
    shutil.copytree(FIXTURES / "proc", procfs)
    attributor = _attributor(procfs)
    attributor.process([_sample(1, PID)])
    attributor.process([_sample(2)])
    shutil.rmtree(procfs / str(PID))  # exited, and /proc no longer has it when the driver lists it late
    attributor.process([_sample(3, PID)])
    assert attributor.device_pods().get("GPU-aaaa") == ()
    assert 'pod="trainer-0"' not in attributor.text()
