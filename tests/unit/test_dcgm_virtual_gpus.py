"""The DCGM view against today's dcgm-exporter: the ``hostname`` label (#655), and with
``--k8s.virtual-gpus`` (its ``--kubernetes-virtual-gpus``, #594) a time-sliced GPU served once per pod,
its GPU_UTIL and FB_USED carrying each pod's own share beside the device-wide series."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter.config import Config
from gpu_exporter.exposition import render
from gpu_exporter.k8s import PodAttributor
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, Sample
from gpu_exporter.naming import dcgm_view
from gpu_exporter.ring import RingBuffer
from tests.support import paths
from tests.support.k8s_fakes import FakeKubelet

LABELS = paths.FIXTURES / "dcgm" / "labels.txt"
K8S = paths.FIXTURES / "k8s"
GPU = DeviceId("0", "GPU-aaaa")
OTHER = DeviceId("1", "GPU-bbbb")
MiB = 2**20
INFO = {"name": "NVIDIA L4", "pci_bus_id": "00000000:07:00.0", "device": "nvidia0", "driver_version": "570.86"}


def _documented() -> set[str]:
    return {ln.strip() for ln in LABELS.read_text(encoding="utf-8").splitlines() if ln.strip() and ln[0] != "#"}


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    # two pods on replicas of GPU 0 (time-slicing); trainer-0 (PID 1001) and trainer-1 (PID 1006) of the
    # fixtures' /proc run on it; a third pod holds a replica and runs nothing
    fake.pods = [
        ("trainer-0", "ml", [("trainer", [("nvidia.com/gpu", ["GPU-aaaa::0"])])]),
        ("trainer-1", "ml", [("trainer", [("nvidia.com/gpu", ["GPU-aaaa::1"])])]),
        ("notebook", "ml", [("jupyter", [("nvidia.com/gpu", ["GPU-aaaa::2"])])]),
    ]
    yield fake
    fake.stop()


def _sample() -> Sample:
    values = {("utilization", ()): 0.9, ("memory_used", ()): 8192.0 * MiB, ("temp_gpu", ()): 60.0}
    processes = (ProcessUsage(1001, 4096.0 * MiB, 0.6), ProcessUsage(1006, 2048.0 * MiB, 0.2))
    return Sample(
        1,
        1000.0,
        (
            DeviceSample(GPU, True, values, dict(INFO), processes),
            DeviceSample(OTHER, True, values, dict(INFO, device="nvidia1")),
        ),
    )


def _page(kubelet: FakeKubelet, virtual: bool) -> str:
    config = Config(
        path_procfs=str(K8S / "proc"),
        k8s_pod_attribution=True,
        k8s_pod_logs_path=str(K8S / "var" / "log" / "pods"),
        k8s_kubelet_socket=kubelet.socket,
    )
    attributor = PodAttributor(config, RingBuffer(8))
    attributor.process([_sample()])
    pods = attributor.device_pods()
    view = dcgm_view("edge-1", pods=pods.get, shares=pods.shares if virtual else None)
    return render(_sample(), view)


def _samples(page: str, family: str) -> list[tuple[dict[str, str], float]]:
    found = {f.name: f for f in text_string_to_metric_families(page)}
    return [(dict(s.labels), s.value) for s in found[family].samples]


def test_a_time_sliced_gpu_is_served_once_per_pod_with_its_own_share(kubelet: FakeKubelet) -> None:
    page = _page(kubelet, virtual=True)
    util = {
        (s.get("pod", ""), s.get("vgpu", "")): v for s, v in _samples(page, "DCGM_FI_DEV_GPU_UTIL") if s["gpu"] == "0"
    }
    # the device-wide series stays; each pod has its processes' share (in percent), the idle one 0
    assert util == {("", ""): 90.0, ("trainer-0", "0"): 60.0, ("trainer-1", "1"): 20.0, ("notebook", "2"): 0.0}
    fb = {s.get("pod", ""): v for s, v in _samples(page, "DCGM_FI_DEV_FB_USED") if s["gpu"] == "0"}
    assert fb == {"": 8192.0, "trainer-0": 4096.0, "trainer-1": 2048.0, "notebook": 0.0}  # MiB
    # other fields: one copy per pod with the device's value, no device-wide series
    temp = [(s["pod"], s["vgpu"], v) for s, v in _samples(page, "DCGM_FI_DEV_GPU_TEMP") if s["gpu"] == "0"]
    assert sorted(temp) == [("notebook", "2", 60.0), ("trainer-0", "0", 60.0), ("trainer-1", "1", 60.0)]
    trainer = next(s for s, _ in _samples(page, "DCGM_FI_DEV_GPU_TEMP") if s["pod"] == "trainer-0")
    assert trainer["pod_uid"] == "1a2b3c4d-0000-4000-8000-000000000001" and trainer["hostname"] == "edge-1"
    # a GPU nobody holds keeps its one series
    assert [v for s, v in _samples(page, "DCGM_FI_DEV_GPU_TEMP") if s["gpu"] == "1"] == [60.0]
    # one family each, and no two series of a family with the same labels
    names = [ln.split()[2] for ln in page.splitlines() if ln.startswith("# TYPE ")]
    assert len(names) == len(set(names))
    for family in text_string_to_metric_families(page):
        keys = [tuple(sorted(s.labels.items())) for s in family.samples]
        assert len(keys) == len(set(keys)), family.name


def test_without_the_option_a_shared_gpu_has_one_series_and_no_owner(kubelet: FakeKubelet) -> None:
    page = _page(kubelet, virtual=False)
    util = [(s, v) for s, v in _samples(page, "DCGM_FI_DEV_GPU_UTIL") if s["gpu"] == "0"]
    assert len(util) == 1 and util[0][0]["pod"] == "" and util[0][1] == 90.0
    assert "vgpu" not in util[0][0]


def test_every_label_is_one_dcgm_exporter_documents(kubelet: FakeKubelet) -> None:
    documented = _documented()
    for virtual in (False, True):
        for family in text_string_to_metric_families(_page(kubelet, virtual)):
            if family.name.startswith("DCGM_FI_"):
                for s in family.samples:
                    assert set(s.labels) <= documented, (family.name, set(s.labels) - documented)
    assert "Hostname" not in _page(kubelet, True)
