"""The kubelet pod-resources API (``v1.PodResourcesLister/List``) over its unix socket.

The few messages needed are decoded by hand from the protobuf wire format, so the only dependency is
grpcio (optional: without it, or without the socket, attribution falls back to /proc). Field numbers
from the kubelet's ``podresources/v1/api.proto``::

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2;
                               repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; ... }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; ... }

Device IDs are what the device plugin advertised: a GPU UUID (``GPU-...``), a MIG device UUID
(``MIG-...``, or the older ``MIG-GPU-<uuid>/<gi>/<ci>``), or a time-slicing replica ``<id>::<n>``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from gpu_exporter.k8s.model import PodRef
from gpu_exporter.model import DeviceId

__all__ = [
    "LIST_METHOD",
    "Assignment",
    "PodResourcesError",
    "decode_list_response",
    "device_matches",
    "list_pod_resources",
]

LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/")


class PodResourcesError(Exception):
    """The API could not be asked; the message is one line."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """One device given to one container."""

    pod: PodRef
    resource: str
    device_id: str


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of one message."""
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = int.from_bytes(data[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("truncated field")
            value, pos = data[pos : pos + length], pos + length
        elif wire == 5:
            value, pos = int.from_bytes(data[pos : pos + 4], "little"), pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if pos > len(data):
            raise ValueError("truncated field")
        yield number, wire, value


def _text(value: int | bytes) -> str:
    if not isinstance(value, bytes):
        raise ValueError("expected a string field")
    return value.decode("utf-8", errors="replace")


def decode_list_response(data: bytes) -> list[Assignment]:
    """The GPU devices per container in a ListPodResourcesResponse (other resources are skipped)."""
    out: list[Assignment] = []
    for number, wire, pod_msg in _fields(data):
        if number != 1 or wire != 2 or not isinstance(pod_msg, bytes):
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, w, v in _fields(pod_msg):
            if n == 1 and w == 2:
                name = _text(v)
            elif n == 2 and w == 2:
                namespace = _text(v)
            elif n == 3 and w == 2 and isinstance(v, bytes):
                containers.append(v)
        for container_msg in containers:
            container = ""
            devices: list[bytes] = []
            for n, w, v in _fields(container_msg):
                if n == 1 and w == 2:
                    container = _text(v)
                elif n == 2 and w == 2 and isinstance(v, bytes):
                    devices.append(v)
            ref = PodRef(namespace, name, container)
            for device_msg in devices:
                resource = ""
                ids: list[str] = []
                for n, w, v in _fields(device_msg):
                    if n == 1 and w == 2:
                        resource = _text(v)
                    elif n == 2 and w == 2:
                        ids.append(_text(v))
                if resource.startswith(GPU_RESOURCE_PREFIXES):
                    out.extend(Assignment(ref, resource, device_id) for device_id in ids)
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


def list_pod_resources(socket_path: str, timeout: float = 5.0) -> list[Assignment]:
    """Ask the kubelet which GPU devices each container holds."""
    try:
        import grpc  # type: ignore[import-untyped]
    except ImportError:
        raise PodResourcesError("grpcio is not installed (pip install 'gpu-exporter[kubernetes]')") from None
    channel = grpc.insecure_channel(f"unix://{socket_path}")
    try:
        call = channel.unary_unary(LIST_METHOD)
        try:
            data = call(b"", timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else ""
            name = code.name if code is not None else "error"
            raise PodResourcesError(f"pod-resources List on {socket_path}: {name} {detail}".strip()) from None
    finally:
        channel.close()
    try:
        return decode_list_response(bytes(data))
    except ValueError as exc:
        raise PodResourcesError(f"pod-resources List on {socket_path}: bad response ({exc})") from None
