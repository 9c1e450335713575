"""DRA, offline: claims read from the kubelet's pod-resources v1 answer (a fake kubelet speaking the real
schema), their devices resolved to GPUs and MIG devices from the CDI specs NVIDIA's DRA driver writes on
the node (fixtures in the driver's format) and the driver's mig-minors table. No API server exists here."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_exporter.config import Config
from gpu_exporter.exposition import render
from gpu_exporter.k8s import PodAttributor, PodRef, cdi
from gpu_exporter.k8s.dra import ClaimResolver, Target
from gpu_exporter.k8s.podresources import ClaimDevice, list_pod_resources
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.naming import dcgm_view
from gpu_exporter.ring import RingBuffer
from tests.support import paths
from tests.support.k8s_fakes import Claim, ClaimResource, FakeKubelet

FIXTURES = paths.FIXTURES / "k8s"
CDI_DIRS = (str(FIXTURES / "cdi" / "etc-cdi"), str(FIXTURES / "cdi" / "var-run-cdi"))
GPU_CLAIM = "0b6c9a4e-5d1f-4c2a-9e3b-7a8d6f5e4c31"  # claim UIDs of the two claim specs in the fixtures
MIG_CLAIM = "d4e5f6a7-1b2c-4d3e-8f9a-0b1c2d3e4f52"
TRAIN_UID = "7d1e2f3a-0000-4000-8000-00000000d7a1"  # from the pods' log directories
NOTEBOOK_UID = "7d1e2f3a-0000-4000-8000-00000000d7a2"

GPU0 = DeviceId("0", "GPU-aaaa")
GPU1 = DeviceId("1", "GPU-bbbb")
PARENT = DeviceId("3", "GPU-dddd")
# a MIG device the driver made for the claim: its UUID is nowhere in the claim or the spec
MIG = DeviceId("3", "MIG-5b1e-dyn", "1", "0", "1g.10gb", "GPU-dddd")
OTHER_MIG = DeviceId("3", "MIG-7c2f-dyn", "2", "0", "1g.10gb", "GPU-dddd")


def _samples(seq: int = 1) -> Sample:
    def device(dev: DeviceId, minor: int) -> DeviceSample:
        return DeviceSample(dev, True, {("utilization", ()): 0.0}, {"device": f"nvidia{minor}", "name": "A100"})

    return Sample(
        seq,
        1000.0 + seq,
        (device(GPU0, 0), device(GPU1, 1), device(PARENT, 3), device(MIG, 3), device(OTHER_MIG, 3)),
    )


TRAIN = Claim(
    "train-gpu", "ml", [ClaimResource("gpu-1", [f"k8s.gpu.nvidia.com/claim={GPU_CLAIM}-gpu-1"], share_id="a1")]
)
NOTEBOOK = Claim(
    "nb-mig",
    "ml",
    [ClaimResource("gpu-3-mig-1g10gb-19-0", [f"k8s.gpu.nvidia.com/claim={MIG_CLAIM}-gpu-3-mig-1g10gb-19-0"])],
)
NIC = Claim("rdma", "ml", [ClaimResource("eth1", ["example.com/net=eth1"], driver="net.example.com")])


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.stop()


def _config(socket: str, cdi_dirs: tuple[str, ...] = CDI_DIRS, procfs: Path = FIXTURES / "proc") -> Config:
    return Config(
        interval=1.0,
        path_procfs=str(procfs),
        k8s_pod_attribution=True,
        k8s_pod_logs_path=str(FIXTURES / "var" / "log" / "pods"),
        k8s_kubelet_socket=socket,
        k8s_cdi_spec_dirs=cdi_dirs,
    )


def _info(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.startswith("gpu_pod_info{"))


# --- the kubelet's answer ------------------------------------------------------------------------


def test_claims_are_read_per_container_with_driver_pool_device_and_cdi_names(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        ("dra-train", "ml", [("main", [], [TRAIN, NIC]), ("sidecar", [])]),
        ("legacy", "ml", [("main", [("nvidia.com/gpu", ["GPU-aaaa"])])]),
    ]
    answer = list_pod_resources(kubelet.socket)
    pod = PodRef("ml", "dra-train", "main")
    assert answer.claims == [
        ClaimDevice(
            pod,
            "ml",
            "train-gpu",
            "gpu.nvidia.com",
            "node-1",
            "gpu-1",
            (f"k8s.gpu.nvidia.com/claim={GPU_CLAIM}-gpu-1",),
        ),
        ClaimDevice(pod, "ml", "rdma", "net.example.com", "node-1", "eth1", ("example.com/net=eth1",)),
    ]
    assert [a.device_id for a in answer.devices] == ["GPU-aaaa"]  # device-plugin devices as before


# --- CDI specs -----------------------------------------------------------------------------------


def test_cdi_specs_name_device_nodes_capabilities_and_uuids() -> None:
    index = cdi.scan(CDI_DIRS)
    assert index.devices[f"k8s.gpu.nvidia.com/claim={GPU_CLAIM}-gpu-1"] == cdi.CdiDevice(minors=(1,))
    # a MIG device: its parent's node and the nodes of its GPU and compute instance
    assert index.devices[f"k8s.gpu.nvidia.com/claim={MIG_CLAIM}-gpu-3-mig-1g10gb-19-0"] == cdi.CdiDevice(
        minors=(3,), caps=(417, 418)
    )
    assert index.devices["k8s.gpu.nvidia.com/device=gpu-0"] == cdi.CdiDevice(minors=(0,))  # older base spec
    assert index.devices["nvidia.com/gpu=GPU-aaaa"].uuids == ("GPU-aaaa",)  # named by UUID
    assert index.devices["nvidia.com/gpu=all"].uuids == ()
    assert index.devices["example.com/gpu=train"] == cdi.CdiDevice(uuids=("GPU-bbbb",))  # NVIDIA_VISIBLE_DEVICES
    assert index.rejected == 1  # broken.yaml, skipped and counted


def test_mig_minors_map_capability_nodes_to_instances() -> None:
    minors = cdi.read_mig_minors(FIXTURES / "proc")
    assert minors.by_minor[417] == (3, 1, None)
    assert minors.by_minor[418] == (3, 1, 0)
    assert cdi.read_mig_minors(FIXTURES / "nowhere").by_minor == {}


# --- end to end: idle pods holding DRA devices ---------------------------------------------------


def test_idle_pods_holding_a_dra_gpu_and_a_dra_mig_device_get_their_series(kubelet: FakeKubelet) -> None:
    """Neither pod runs a GPU process: only the kubelet's claims and the node's CDI specs say what they
    hold. The GPU is gpu-1 (its minor, /dev/nvidia1); the MIG device was made for the claim, and only
    its parent's minor and its instance capability nodes name it."""
    kubelet.pods = [
        ("dra-train", "ml", [("main", [], [TRAIN])]),
        ("dra-notebook", "ml", [("jupyter", [], [NOTEBOOK])]),
        ("net", "ml", [("main", [], [NIC])]),
    ]
    registry = CollectorRegistry()
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8), registry)
    attributor.process([_samples()])
    assert _info(attributor.text()) == [
        'gpu_pod_info{gpu="1",uuid="GPU-bbbb",namespace="ml",pod="dra-train",container="main",'
        f'pod_uid="{TRAIN_UID}"}} 1',
        'gpu_pod_info{gpu="3",uuid="MIG-5b1e-dyn",gpu_instance="1",compute_instance="0",mig_profile="1g.10gb",'
        f'parent_uuid="GPU-dddd",namespace="ml",pod="dra-notebook",container="jupyter",pod_uid="{NOTEBOOK_UID}"}} 1',
    ]
    metrics = generate_latest(registry).decode()
    assert "gpu_exporter_k8s_pods 2.0" in metrics
    assert 'gpu_exporter_k8s_claim_devices{state="matched"} 2.0' in metrics
    assert 'gpu_exporter_k8s_claim_devices{state="unmatched"} 1.0' in metrics  # the NIC: no GPU is it


def test_the_dcgm_view_labels_dra_pods(kubelet: FakeKubelet) -> None:
    kubelet.pods = [("dra-train", "ml", [("main", [], [TRAIN])])]
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8))
    attributor.process([_samples()])
    page = render(_samples(), dcgm_view("edge-1", pods=attributor.device_pods().get))
    util = [line for line in page.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    by_gpu = {line.split('gpu="', 1)[1].split('"', 1)[0]: line for line in util}
    assert 'container="main",namespace="ml",pod="dra-train"' in by_gpu["1"]
    assert 'pod=""' in by_gpu["0"]


def test_older_driver_base_spec_and_uuid_named_devices(kubelet: FakeKubelet) -> None:
    """Releases before 25.x: the claim names the standard device of the base spec. A CDI device named by
    its UUID (nvidia-ctk's uuid strategy) or carrying NVIDIA_VISIBLE_DEVICES needs no minor at all."""
    kubelet.pods = [
        (
            "old",
            "ml",
            [("main", [], [Claim("c", "ml", [ClaimResource("gpu-0", ["k8s.gpu.nvidia.com/device=gpu-0"])])])],
        ),
        ("uuid", "ml", [("main", [], [Claim("c", "ml", [ClaimResource("x", ["nvidia.com/gpu=GPU-aaaa"], "other")])])]),
        ("env", "ml", [("main", [], [Claim("c", "ml", [ClaimResource("x", ["example.com/gpu=train"], "other")])])]),
    ]
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8))
    attributor.process([_samples()])
    owners = {
        (line.split('uuid="')[1].split('"')[0], line.split('pod="')[1].split('"')[0])
        for line in _info(attributor.text())
    }
    assert owners == {("GPU-aaaa", "old"), ("GPU-aaaa", "uuid"), ("GPU-bbbb", "env")}


def test_without_a_spec_the_nvidia_device_name_still_names_the_gpu_but_never_a_mig_device(
    kubelet: FakeKubelet, tmp_path: Path
) -> None:
    kubelet.pods = [
        ("dra-train", "ml", [("main", [], [TRAIN])]),
        ("dra-notebook", "ml", [("jupyter", [], [NOTEBOOK])]),
    ]
    attributor = PodAttributor(_config(kubelet.socket, cdi_dirs=(str(tmp_path),)), RingBuffer(8))
    attributor.process([_samples()])
    info = _info(attributor.text())
    assert len(info) == 1 and 'uuid="GPU-bbbb"' in info[0] and 'pod="dra-train"' in info[0]


def test_a_mig_spec_without_mig_minors_is_not_the_whole_gpu(kubelet: FakeKubelet, tmp_path: Path) -> None:
    kubelet.pods = [("dra-notebook", "ml", [("jupyter", [], [NOTEBOOK])])]
    attributor = PodAttributor(_config(kubelet.socket, procfs=tmp_path), RingBuffer(8))
    attributor.process([_samples()])
    assert attributor.text() == ""


def test_a_claim_spec_written_after_the_first_look_is_read_at_once(tmp_path: Path) -> None:
    """The driver writes a claim's spec while preparing it: an unknown CDI name re-reads the
    directories (at most once a second), without waiting for the refresh interval."""
    now = [0.0]
    resolver = ClaimResolver((str(tmp_path),), str(FIXTURES / "proc"), refresh=3600.0, clock=lambda: now[0])
    claim = ClaimDevice(
        PodRef("ml", "p", "c"), "ml", "x", "example.com", "n", "dev", ("k8s.gpu.nvidia.com/claim=u-gpu-7",)
    )
    assert resolver.resolve([claim]) == [(claim, [])]
    (tmp_path / "k8s.gpu.nvidia.com-claim_u.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\n"
        "devices:\n- name: u-gpu-7\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia7\n"
    )
    now[0] = 0.5
    assert resolver.resolve([claim]) == [(claim, [])]  # within the second: not yet
    now[0] = 1.0
    assert resolver.resolve([claim]) == [(claim, [Target(minor=7)])]


def test_spec_files_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("kind: a/b\ndevices: []\n" + "#" * (cdi.MAX_BYTES + 1))
    shutil.copy(FIXTURES / "cdi" / "var-run-cdi" / "k8s.gpu.nvidia.com-device_base.yaml", tmp_path)
    index = cdi.scan((str(tmp_path),))
    assert index.rejected == 1 and "k8s.gpu.nvidia.com/device=gpu-1" in index.devices
