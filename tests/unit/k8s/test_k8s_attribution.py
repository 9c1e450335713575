"""Pod attribution end to end: samples in, per-pod series out, against fixture /proc and log trees
and a fake kubelet on a unix socket."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor, PodRef
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, Sample
from gpu_exporter.ring import RingBuffer
from tests.support import paths
from tests.support.k8s_fakes import FakeKubelet

FIXTURES = paths.FIXTURES / "k8s"
GPU0 = DeviceId("0", "GPU-aaaa")
GPU1 = DeviceId("1", "GPU-bbbb")
GPU2 = DeviceId("2", "GPU-cccc")
MIG = DeviceId("3", "MIG-1111", "1", "0", "1g.10gb", "GPU-dddd")
GiB = 1024**3
TRAINER_0_UID = 'pod_uid="1a2b3c4d-0000-4000-8000-000000000001"'  # from its cgroup path and log directory


def _config(socket: str = "/nonexistent/kubelet.sock", idle: float | None = 50.0) -> Config:
    return Config(
        interval=1.0,
        path_procfs=str(FIXTURES / "proc"),
        k8s_pod_attribution=True,
        k8s_pod_logs_path=str(FIXTURES / "var" / "log" / "pods"),
        k8s_kubelet_socket=socket,
        k8s_idle_power=idle,
    )


def _device(device: DeviceId, power: float | None = None, *processes: ProcessUsage) -> DeviceSample:
    values = {("power", ()): power} if power is not None else {}
    return DeviceSample(device, True, values, {}, tuple(processes))


def _sample(seq: int, timestamp: float, *devices: DeviceSample) -> Sample:
    return Sample(seq, timestamp, tuple(devices))


def _fallback_sample(seq: int, timestamp: float, with_trainer_1: bool = True) -> Sample:
    gpu0 = [ProcessUsage(1001, 4 * GiB, 0.6), ProcessUsage(1005, 100 * 1024**2, 0.0)]
    if with_trainer_1:
        gpu0.append(ProcessUsage(1006, 2 * GiB, 0.2))
    return _sample(
        seq,
        timestamp,
        _device(GPU0, 250.0, *gpu0),
        _device(
            GPU1,
            100.0,
            ProcessUsage(1002, 1e9, 0.3),
            ProcessUsage(1003, None, None),
            ProcessUsage(1007, 1e9, 0.5),
        ),
        _device(MIG, None, ProcessUsage(1004, 5e8, None)),
    )


# Hand-checked expected page (see the docstring of the test below for the energy figures).
EXPECTED_FALLBACK = FIXTURES / "expected_fallback.prom"


def test_fallback_attributes_processes_to_pods() -> None:
    """Without a kubelet socket (KubeEdge), /proc and the log directories name the pods.

    Energy worked by hand, idle 50 W, samples 2 s apart:
    GPU 0 at 250 W: (250 - 50) x 2 = 400 J active; trainer-0 : trainer-1 = 0.6 : 0.2 -> 300 J and 100 J
    (Xorg, a host process, is nobody's). GPU 1 at 100 W: (100 - 50) x 2 = 100 J, all to resnet (0.3; the
    transcoder reports no utilization, so 0). The MIG instance has no power reading: no energy series.
    The deleted pod's process (PID 1007) is left out.
    """
    attributor = PodAttributor(_config(), RingBuffer(8))
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    assert attributor.text() == EXPECTED_FALLBACK.read_text(encoding="utf-8")
    pods = attributor.device_pods()
    trainers = (PodRef("ml", "trainer-0", "trainer"), PodRef("ml", "trainer-1", "trainer"))
    assert pods.get("GPU-aaaa") == trainers
    assert pods.get("GPU-zzzz") == ()


def test_finished_pod_disappears_at_once() -> None:
    attributor = PodAttributor(_config(), RingBuffer(8))
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    assert 'pod="trainer-1"' in attributor.text()
    attributor.process([_fallback_sample(3, 1004.0, with_trainer_1=False)])
    text = attributor.text()
    assert 'pod="trainer-1"' not in text
    # trainer-0 keeps its running total: 300 J + 2 s x 200 W, all its own now = 700 J
    assert (
        'gpu_pod_energy_joules_total{gpu="0",uuid="GPU-aaaa",namespace="ml",pod="trainer-0",container="trainer",'
        f"{TRAINER_0_UID}}} 700\n"
    ) in text


def test_page_passes_promtool_check_metrics() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    attributor = PodAttributor(_config(), RingBuffer(8))
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=attributor.text(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.stop()


def test_pod_resources_names_pods_without_processes(kubelet: FakeKubelet) -> None:
    """The kubelet's view adds containers that hold a GPU but run nothing on it yet, MIG devices,
    and time-slicing replicas (two pods on one GPU)."""
    kubelet.pods = [
        ("trainer-0", "ml", [("trainer", [("nvidia.com/gpu", ["GPU-aaaa"])])]),
        ("idle-job", "batch", [("main", [("nvidia.com/gpu", ["GPU-bbbb"])])]),
        ("infer-a", "serve", [("server", [("nvidia.com/gpu", ["GPU-cccc::0"])])]),
        ("infer-b", "serve", [("server", [("nvidia.com/gpu", ["GPU-cccc::1"])])]),
        ("notebook", "ml", [("jupyter", [("nvidia.com/mig-1g.10gb", ["MIG-1111"])])]),
    ]
    now = [0.0]
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8), clock=lambda: now[0])
    sample = _sample(
        1,
        1000.0,
        _device(GPU0, 100.0, ProcessUsage(1001, 1 * GiB, 0.5)),
        _device(GPU1, 60.0),
        _device(GPU2, 60.0),
        _device(MIG),
    )
    attributor.process([sample])
    info = sorted(line for line in attributor.text().splitlines() if line.startswith("gpu_pod_info"))
    assert info == sorted(
        [
            f'gpu_pod_info{{gpu="0",uuid="GPU-aaaa",namespace="ml",pod="trainer-0",container="trainer",{TRAINER_0_UID}}} 1',
            # no process, no log directory in the fixtures: no UID to be had
            'gpu_pod_info{gpu="1",uuid="GPU-bbbb",namespace="batch",pod="idle-job",container="main",pod_uid=""} 1',
            'gpu_pod_info{gpu="2",uuid="GPU-cccc",namespace="serve",pod="infer-a",container="server",pod_uid=""} 1',
            'gpu_pod_info{gpu="2",uuid="GPU-cccc",namespace="serve",pod="infer-b",container="server",pod_uid=""} 1',
            # no process either: its UID from its log directory's name
            'gpu_pod_info{gpu="3",uuid="MIG-1111",gpu_instance="1",compute_instance="0",mig_profile="1g.10gb",'
            'parent_uuid="GPU-dddd",namespace="ml",pod="notebook",container="jupyter",'
            'pod_uid="44444444-4444-4444-8444-444444444444"} 1',
        ]
    )
    # the same container seen by both sources is one series, with the process's memory
    assert attributor.text().count('pod="trainer-0"') == 4  # info, memory, utilization, energy
    # the kubelet stops listing a finished pod: the List is kept for the refresh interval (10 s) ...
    kubelet.pods = [p for p in kubelet.pods if p[0] != "idle-job"]
    now[0] = 5.0
    attributor.process([_sample(2, 1001.0, *sample.devices)])
    assert "idle-job" in attributor.text() and kubelet.calls == 1
    # ... and the pod is gone from the page that follows the next List
    now[0] = 10.0
    attributor.process([_sample(3, 1002.0, *sample.devices)])
    assert "idle-job" not in attributor.text()
    assert kubelet.calls == 2


def test_kubelet_failure_falls_back_to_proc_and_is_counted(kubelet: FakeKubelet) -> None:
    import grpc

    kubelet.fail = grpc.StatusCode.PERMISSION_DENIED
    registry = CollectorRegistry()
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8), registry)
    attributor.process([_fallback_sample(1, 1000.0)])
    assert 'pod="trainer-0"' in attributor.text()
    metrics = generate_latest(registry).decode()
    assert 'gpu_exporter_k8s_errors_total{source="pod_resources"} 1.0' in metrics
    assert "gpu_exporter_k8s_pods 5.0" in metrics
    # a refused kubelet is not asked again at every sample, only after the refresh interval
    attributor.process([_fallback_sample(2, 1001.0)])
    assert kubelet.calls == 1
    assert 'gpu_exporter_k8s_errors_total{source="pod_resources"} 1.0' in generate_latest(registry).decode()


def test_background_thread_follows_the_ring() -> None:
    ring = RingBuffer(8)
    attributor = PodAttributor(_config(), ring)
    attributor.start()
    try:
        assert attributor.text() == ""
        ring.append(_fallback_sample(1, 1000.0))
        ring.append(_fallback_sample(2, 1002.0))
        deadline = time.monotonic() + 10
        while "gpu_pod_energy_joules_total" not in attributor.text() or " 300\n" not in attributor.text():
            assert time.monotonic() < deadline, attributor.text()
            time.sleep(0.02)
        assert 'pod="trainer-0"' in attributor.text()
    finally:
        attributor.stop(5)


def test_min_observed_idle_power_when_not_configured() -> None:
    """Idle power unset: the lowest power seen on each GPU. GPU 0 reads 250 W then 150 W: the second
    interval is (150 - 150) x 2 = 0 J; a third at 250 W gives (250 - 150) x 2 = 200 J -> 150 J and 50 J."""
    attributor = PodAttributor(_config(idle=None), RingBuffer(8))

    def at(seq: int, t: float, power: float) -> Sample:
        processes = (ProcessUsage(1001, None, 0.6), ProcessUsage(1006, None, 0.2))
        return _sample(seq, t, _device(GPU0, power, *processes))

    attributor.process([at(1, 0.0, 250.0), at(2, 2.0, 150.0), at(3, 4.0, 250.0)])
    text = attributor.text()
    assert f'pod="trainer-0",container="trainer",{TRAINER_0_UID}}} 150\n' in text
    assert 'pod="trainer-1",container="trainer",pod_uid="55555555-5555-4555-8555-555555555555"} 50\n' in text


def test_restarted_container_is_named_once_its_link_appears(tmp_path: Path) -> None:
    """A container restart gets a new ID; in a pod of several containers its name comes from the new
    /var/log/containers link, picked up without waiting for the refresh interval."""
    shutil.copytree(FIXTURES, tmp_path / "k8s", symlinks=True)
    root = tmp_path / "k8s"
    uid = "22222222-2222-4222-8222-222222222222"
    new_id = "7" * 64
    (root / "proc" / "2001").mkdir()
    (root / "proc" / "2001" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/{new_id}\n")
    config = Config(
        path_procfs=str(root / "proc"),
        k8s_pod_logs_path=str(root / "var" / "log" / "pods"),
        k8s_kubelet_socket=str(tmp_path / "none.sock"),
        k8s_refresh_interval=3600.0,
    )
    attributor = PodAttributor(config, RingBuffer(8))
    sample = _sample(1, 1000.0, _device(GPU1, None, ProcessUsage(2001, 1e9, 0.1)))
    attributor.process([sample])
    assert 'pod="resnet-7f9c",container=""' in attributor.text()  # two containers, no link yet
    link = root / "var" / "log" / "containers" / f"resnet-7f9c_inference_log-shipper-{new_id}.log"
    link.symlink_to(f"../pods/inference_resnet-7f9c_{uid}/log-shipper/1.log")
    time.sleep(1.05)  # re-indexing is limited to once a second
    attributor.process([_sample(2, 1001.0, *sample.devices)])
    assert 'pod="resnet-7f9c",container="log-shipper"' in attributor.text()
