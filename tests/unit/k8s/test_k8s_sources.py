"""The three sources of pod attribution, each against its boundary: /proc cgroup files, the kubelet's
log directories (checked-in fixture trees), and the pod-resources API (a fake kubelet on a socket)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_exporter.k8s import cgroup, podlogs
from gpu_exporter.k8s.model import PodRef
from gpu_exporter.k8s.podresources import (
    Assignment,
    PodResourcesError,
    decode_list_response,
    device_matches,
    list_pod_resources,
)
from gpu_exporter.model import DeviceId
from tests.support import paths
from tests.support.k8s_fakes import FakeKubelet, encode_response

FIXTURES = paths.FIXTURES / "k8s"
PROC = FIXTURES / "proc"
PODS = FIXTURES / "var" / "log" / "pods"
CID = {name: ch * 64 for name, ch in zip(["a", "b", "c", "d", "e", "f"], "abcdef", strict=True)}


# --- /proc/<pid>/cgroup --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pid", "uid", "container_id"),
    [
        (1001, "1a2b3c4d-0000-4000-8000-000000000001", CID["a"]),  # v2, systemd, containerd
        (1002, "22222222-2222-4222-8222-222222222222", CID["b"]),  # v1, cgroupfs, docker
        (1003, "33333333-3333-4333-8333-333333333333", CID["c"]),  # v2, systemd, CRI-O, guaranteed
        (1004, "44444444-4444-4444-8444-444444444444", CID["d"]),  # v2 inside a cgroup namespace
        (1006, "55555555-5555-4555-8555-555555555555", CID["e"]),  # v1, systemd, containerd
    ],
)
def test_cgroup_forms_give_pod_uid_and_container_id(pid: int, uid: str, container_id: str) -> None:
    found = cgroup.read_pid(PROC, pid)
    assert found == cgroup.ContainerCgroup(uid, container_id)


def test_host_process_and_missing_pid_are_not_pods() -> None:
    assert cgroup.read_pid(PROC, 1005) is None  # Xorg in system.slice
    assert cgroup.read_pid(PROC, 424242) is None  # exited between listing and reading


def test_crio_conmon_is_not_a_container() -> None:
    uid = "66666666-6666-4666-8666-666666666666"
    text = (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid.replace('-', '_')}.slice/"
        f"crio-conmon-{'1' * 64}.scope\n"
    )
    assert cgroup.parse_cgroup(text) == cgroup.ContainerCgroup(uid, "")
    # v1 with the conmon line first and the container's own line after it: the container wins
    text = (
        f"5:pids:/kubepods/pod{uid}/crio-conmon-{'1' * 64}.scope\n4:memory:/kubepods/pod{uid}/crio-{'2' * 64}.scope\n"
    )
    assert cgroup.parse_cgroup(text) == cgroup.ContainerCgroup(uid, "2" * 64)


def test_garbage_cgroup_text_is_not_a_pod() -> None:
    assert cgroup.parse_cgroup("") is None
    assert cgroup.parse_cgroup("not a cgroup file\n\x00\xff") is None
    assert cgroup.parse_cgroup("0::/kubepods/podnot-a-uid/abc\n") is None


# --- /var/log/pods and /var/log/containers -------------------------------------------------------


def test_pod_log_directories_name_namespace_pod_and_container() -> None:
    directory = podlogs.scan(PODS)
    # the container ID link names the container among several
    assert directory.names("22222222-2222-4222-8222-222222222222", CID["b"]) == (
        "inference",
        "resnet-7f9c",
        "server",
    )
    # no link, one container: that one
    assert directory.names("33333333-3333-4333-8333-333333333333", CID["c"]) == (
        "video",
        "transcoder",
        "ffmpeg",
    )
    # no link, two containers: the pod is known, the container is not
    assert directory.names("22222222-2222-4222-8222-222222222222", "0" * 64) == (
        "inference",
        "resnet-7f9c",
        "",
    )
    # a deleted pod
    assert directory.names("77777777-7777-4777-8777-777777777777", CID["f"]) is None


def test_missing_log_directory_is_empty_not_an_error(tmp_path: Path) -> None:
    directory = podlogs.scan(tmp_path / "nope" / "pods")
    assert directory.pods == {} and directory.containers == {}


# --- pod-resources API ---------------------------------------------------------------------------


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.stop()


def test_list_over_the_socket_gives_gpu_devices_per_container(kubelet: FakeKubelet) -> None:
    kubelet.pods = [
        ("trainer-0", "ml", [("trainer", [("nvidia.com/gpu", ["GPU-aaaa", "GPU-bbbb"])])]),
        ("notebook", "ml", [("jupyter", [("nvidia.com/mig-1g.10gb", ["MIG-1111"])])]),
        # time-slicing: two replicas of one GPU given to two pods
        ("infer-a", "serve", [("server", [("nvidia.com/gpu", ["GPU-cccc::0"])])]),
        (
            "infer-b",
            "serve",
            [
                ("server", [("nvidia.com/gpu", ["GPU-cccc::3"])]),
                ("sidecar", [("example.com/fpga", ["fpga-0"])]),
            ],
        ),
        ("web", "default", [("nginx", [])]),
    ]
    assignments = list_pod_resources(kubelet.socket).devices
    assert assignments == [
        Assignment(PodRef("ml", "trainer-0", "trainer"), "nvidia.com/gpu", "GPU-aaaa"),
        Assignment(PodRef("ml", "trainer-0", "trainer"), "nvidia.com/gpu", "GPU-bbbb"),
        Assignment(PodRef("ml", "notebook", "jupyter"), "nvidia.com/mig-1g.10gb", "MIG-1111"),
        Assignment(PodRef("serve", "infer-a", "server"), "nvidia.com/gpu", "GPU-cccc::0"),
        Assignment(PodRef("serve", "infer-b", "server"), "nvidia.com/gpu", "GPU-cccc::3"),
    ]
    assert kubelet.calls == 1


def test_kubelet_error_is_one_line(kubelet: FakeKubelet) -> None:
    kubelet.fail = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(PodResourcesError) as info:
        list_pod_resources(kubelet.socket)
    message = str(info.value)
    assert "UNAVAILABLE" in message and kubelet.socket in message and "\n" not in message


def test_socket_without_a_server_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PodResourcesError) as info:
        list_pod_resources(str(tmp_path / "kubelet.sock"), timeout=1.0)
    assert "\n" not in str(info.value)


def test_truncated_response_is_rejected() -> None:
    data = encode_response([("p", "ns", [("c", [("nvidia.com/gpu", ["GPU-aaaa"])])])])
    assert decode_list_response(data).devices  # whole: fine
    with pytest.raises(ValueError):
        decode_list_response(data[:-3])


@pytest.mark.parametrize(
    ("device_id", "device", "expected"),
    [
        ("GPU-aaaa", DeviceId("0", "GPU-aaaa"), True),
        ("GPU-aaaa::2", DeviceId("0", "GPU-aaaa"), True),  # time-slicing replica
        ("GPU-aaaa", DeviceId("1", "GPU-bbbb"), False),
        ("GPU-aaaa-1", DeviceId("0", "GPU-aaaa"), False),
        ("MIG-1111", DeviceId("0", "MIG-1111", "1", "0", "1g.10gb", "GPU-aaaa"), True),
        ("MIG-GPU-aaaa/1/0", DeviceId("0", "MIG-1111", "1", "0", "1g.10gb", "GPU-aaaa"), True),  # older form
        ("MIG-GPU-aaaa/2/0", DeviceId("0", "MIG-1111", "1", "0", "1g.10gb", "GPU-aaaa"), False),
        ("GPU-aaaa", DeviceId("0", "MIG-1111", "1", "0", "1g.10gb", "GPU-aaaa"), False),
    ],
)
def test_device_ids_match_gpus_mig_instances_and_replicas(device_id: str, device: DeviceId, expected: bool) -> None:
    assert device_matches(device_id, device) is expected
