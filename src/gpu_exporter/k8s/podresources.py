"""The kubelet pod-resources API (``v1.PodResourcesLister/List``) over its unix socket.

The messages are decoded by hand from the protobuf wire format (``wire.py``), so the only dependency is
grpcio (optional: without it, or without the socket, attribution falls back to /proc). Field numbers
from the kubelet's ``pkg/apis/podresources/v1/api.proto`` (k8s.io/kubelet), the parts read here::

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2;
                               repeated ContainerResources containers = 3; ... }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; ...
                               repeated DynamicResource dynamic_resources = 5; }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; ... }
    DynamicResource          { string claim_name = 2; string claim_namespace = 3;
                               repeated ClaimResource claim_resources = 4; }   (1 was class_name)
    ClaimResource            { repeated CDIDevice cdi_devices = 1; string driver_name = 2;
                               string pool_name = 3; string device_name = 4; optional string share_id = 5; }
    CDIDevice                { string name = 1; }   (fully qualified: vendor.com/class=name)

Device-plugin IDs are what the plugin advertised: a GPU UUID (``GPU-...``), a MIG device UUID
(``MIG-...``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``), or a time-slicing replica ``<id>::<n>``.
Dynamic resources (DRA, KEP-3695: beta and on by default from Kubernetes 1.34) name a device by its
driver, pool and device name and the CDI devices the runtime injected; ``dra.py`` turns those into a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpu_exporter.k8s import wire
from gpu_exporter.k8s.model import PodRef
from gpu_exporter.model import DeviceId

__all__ = [
    "LIST_METHOD",
    "Assignment",
    "ClaimDevice",
    "PodResources",
    "PodResourcesError",
    "decode_list_response",
    "device_matches",
    "list_pod_resources",
]

LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/")


class PodResourcesError(Exception):
    """The API could not be asked; the message is one line. ``kind`` names the failure without the
    kubelet's own words (a gRPC status, "bad response"): what to say once, with bounded memory."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind or message


@dataclass(frozen=True, slots=True)
class Assignment:
    """One device given to one container by a device plugin."""

    pod: PodRef
    resource: str
    device_id: str


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of a ResourceClaim (DRA) prepared for one container."""

    pod: PodRef
    claim_namespace: str
    claim_name: str
    driver: str  # e.g. gpu.nvidia.com
    pool: str  # the node name, for the NVIDIA driver
    device: str  # e.g. gpu-0, gpu-0-mig-1g10gb-19-0
    cdi_devices: tuple[str, ...] = ()  # e.g. k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0


@dataclass(frozen=True)
class PodResources:
    """What the kubelet says each container holds: device-plugin devices and DRA claim devices."""

    devices: list[Assignment] = field(default_factory=list)
    claims: list[ClaimDevice] = field(default_factory=list)


_POD = frozenset({1, 2, 3})  # name, namespace, containers
_CONTAINER = frozenset({1, 2, 5})  # name, devices, dynamic_resources
_DEVICES = frozenset({1, 2})  # resource_name, device_ids
_CLAIM = frozenset({2, 3, 4})  # claim_name, claim_namespace, claim_resources
_CLAIM_RESOURCE = frozenset({1, 2, 3, 4})  # cdi_devices, driver_name, pool_name, device_name


def _last(found: dict[int, list[bytes]], number: int) -> str:
    values = found.get(number)
    return wire.text(values[-1]) if values else ""  # proto3: the last one wins


def _claims(ref: PodRef, message: bytes) -> list[ClaimDevice]:
    claim = wire.split(message, _CLAIM)
    out = []
    for resource in claim.get(4, ()):
        values = wire.split(resource, _CLAIM_RESOURCE)
        cdi = (_last(wire.split(d, frozenset({1})), 1) for d in values.get(1, ()))
        out.append(
            ClaimDevice(
                ref,
                _last(claim, 3),
                _last(claim, 2),
                _last(values, 2),
                _last(values, 3),
                _last(values, 4),
                tuple(name for name in cdi if name),
            )
        )
    return out


def decode_list_response(data: bytes) -> PodResources:
    """GPU devices (other device-plugin resources are skipped) and DRA claim devices per container."""
    out = PodResources()
    for pod_msg in wire.messages(data, 1):
        pod = wire.split(pod_msg, _POD)
        name, namespace = _last(pod, 1), _last(pod, 2)
        for container_msg in pod.get(3, ()):
            container = wire.split(container_msg, _CONTAINER)
            ref = PodRef(namespace, name, _last(container, 1))
            for device_msg in container.get(2, ()):
                device = wire.split(device_msg, _DEVICES)
                resource = _last(device, 1)
                if resource.startswith(GPU_RESOURCE_PREFIXES):
                    out.devices.extend(Assignment(ref, resource, wire.text(i)) for i in device.get(2, ()))
            for claim_msg in container.get(5, ()):
                out.claims.extend(_claims(ref, claim_msg))
    return out


def device_matches(device_id: str, device: DeviceId) -> bool:
    """Whether a device plugin's ID names this GPU or MIG instance."""
    base = device_id.split("::", 1)[0]  # time-slicing replica <id>::<n>
    if base == device.uuid:
        return True
    if device.is_mig and base.startswith("MIG-GPU-"):  # older MIG-GPU-<parent uuid>/<gi>/<ci>
        parent, _, rest = base[len("MIG-") :].partition("/")
        return parent == device.parent_uuid and rest == f"{device.gpu_instance}/{device.compute_instance}"
    return False


def list_pod_resources(socket_path: str, timeout: float = 5.0) -> PodResources:
    """Ask the kubelet which GPU devices and DRA claims each container holds."""
    try:
        import grpc  # type: ignore[import-untyped]
    except ImportError:
        raise PodResourcesError(
            "grpcio is not installed (pip install 'gpu-exporter[kubernetes]')", "no grpcio"
        ) from None
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        call = channel.unary_unary(LIST_METHOD)
        try:
            data = call(b"", timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else ""
            name = code.name if code is not None else "error"
            detail = " ".join(str(detail or "").split())[:200]  # one line, bounded: the kubelet's own text
            raise PodResourcesError(f"pod-resources List on {socket_path}: {name} {detail}".strip(), name) from None
    finally:
        channel.close()
    try:
        return decode_list_response(bytes(data))
    except ValueError as exc:
        raise PodResourcesError(f"pod-resources List on {socket_path}: bad response ({exc})", "bad response") from None
