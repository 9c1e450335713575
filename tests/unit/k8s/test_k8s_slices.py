"""The optional route: a DRA device that no CDI spec on the node resolves is looked up in this node's
ResourceSlices, only with --k8s.resource-slices and a service-account token, against a fake API server
on 127.0.0.1 that wants the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_exporter.k8s import PodAttributor
from gpu_exporter.k8s.slices import api_url, index_slices
from gpu_exporter.ring import RingBuffer
from tests.support.k8s_fakes import Claim, ClaimResource, FakeKubelet, FakePodList
from tests.unit.k8s.test_k8s_dra import _config, _samples

PATH = "/apis/resource.k8s.io/v1/resourceslices"


def _slice(driver: str, pool: str, devices: dict[str, str], beta: bool = False) -> dict[str, object]:
    def device(name: str, uuid: str) -> dict[str, object]:
        attributes = {"uuid": {"string": uuid}, "type": {"string": "mig" if uuid.startswith("MIG") else "gpu"}}
        return {"name": name, "basic": {"attributes": attributes}} if beta else {"name": name, "attributes": attributes}

    spec = {"driver": driver, "nodeName": "node-1", "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}}
    spec["devices"] = [device(name, uuid) for name, uuid in devices.items()]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{pool}-x"},
        "spec": spec,
    }


# a claim of a static MIG device whose spec the node does not have (written elsewhere, or by a driver
# that puts neither nodes nor UUIDs in it)
STATIC_MIG = Claim("mig", "ml", [ClaimResource("gpu-3-mig-1g10gb-19-0", ["k8s.gpu.nvidia.com/claim=gone-mig"])])


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    fake.pods = [("dra-notebook", "ml", [("jupyter", [], [STATIC_MIG])])]
    yield fake
    fake.stop()


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[FakePodList, Path]]:
    fake = FakePodList(PATH).start()
    fake.token = "sa-token"
    fake.pods = [_slice("gpu.nvidia.com", "node-1", {"gpu-3-mig-1g10gb-19-0": "MIG-5b1e-dyn", "gpu-0": "GPU-aaaa"})]
    token = tmp_path / "token"
    token.write_text("sa-token\n")
    yield fake, token
    fake.stop()


def _attributor(kubelet: FakeKubelet, registry: CollectorRegistry | None = None, **options: object) -> PodAttributor:
    config = _config(kubelet.socket)
    config = type(config)(**{**config.__dict__, "node_name": "node-1", **options})
    return PodAttributor(config, RingBuffer(8), registry)


def test_off_by_default_the_api_server_is_never_asked(kubelet: FakeKubelet, api: tuple[FakePodList, Path]) -> None:
    fake, token = api
    attributor = _attributor(kubelet, k8s_api_url=fake.url.removesuffix(PATH), k8s_api_token_file=str(token))
    attributor.process([_samples()])
    assert attributor.text() == "" and fake.calls == 0


def test_a_device_no_spec_resolves_is_found_in_the_slices(kubelet: FakeKubelet, api: tuple[FakePodList, Path]) -> None:
    fake, token = api
    attributor = _attributor(
        kubelet, k8s_resource_slices=True, k8s_api_url=fake.url.removesuffix(PATH), k8s_api_token_file=str(token)
    )
    attributor.process([_samples()])
    info = [line for line in attributor.text().splitlines() if line.startswith("gpu_pod_info{")]
    assert len(info) == 1 and 'uuid="MIG-5b1e-dyn"' in info[0] and 'pod="dra-notebook"' in info[0]
    assert fake.calls == 1


def test_without_a_token_nothing_is_asked_and_the_failure_is_counted(
    kubelet: FakeKubelet, api: tuple[FakePodList, Path], tmp_path: Path
) -> None:
    fake, _ = api
    attributor = _attributor(
        kubelet,
        k8s_resource_slices=True,
        k8s_api_url=fake.url.removesuffix(PATH),
        k8s_api_token_file=str(tmp_path / "none"),
    )
    attributor.process([_samples()])
    assert attributor.text() == "" and fake.calls == 0
    registry = CollectorRegistry()
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it")
    attributor = _attributor(
        kubelet,
        registry,
        k8s_resource_slices=True,
        k8s_api_url=fake.url.removesuffix(PATH),
        k8s_api_token_file=str(wrong),
    )
    attributor.process([_samples()])
    assert attributor.text() == ""  # 401 on every version
    assert 'gpu_exporter_k8s_errors_total{source="resource_slices"} 1.0' in generate_latest(registry).decode()


def test_slices_of_older_api_versions_and_the_in_cluster_address() -> None:
    beta = _slice("gpu.nvidia.com", "node-1", {"gpu-1": "GPU-bbbb"}, beta=True)
    other = _slice("net.example.com", "node-1", {"eth1": "not-a-gpu"})
    assert index_slices([beta, other, {"spec": None}]) == {("gpu.nvidia.com", "node-1", "gpu-1"): "GPU-bbbb"}
    assert (
        api_url("", {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
        == "https://10.96.0.1:443"
    )
    assert api_url("", {"KUBERNETES_SERVICE_HOST": "fd00::1"}) == "https://[fd00::1]:443"
    assert api_url("", {}) == "" and api_url("http://127.0.0.1:1/", {}) == "http://127.0.0.1:1"
