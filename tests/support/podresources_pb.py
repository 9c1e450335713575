"""The kubelet's pod-resources v1 messages for the fake kubelet, built with Google's protobuf runtime.

The schema is declared here, field for field, as k8s.io/kubelet's ``pkg/apis/podresources/v1/api.proto``
defines it (Kubernetes 1.34+: pod-level cpu_ids and memory, DynamicResource without its retired
class_name, ClaimResource with driver, pool, device and share_id), so the fake's answers are encoded by
the protobuf library itself, independently of the hand decoder under test.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _UINT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# message -> [(field, number, type, label, message type or "")]
_SCHEMA: dict[str, list[tuple[str, int, int, int, str]]] = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")],
    "PodResources": [
        ("name", 1, _STRING, _ONE, ""),
        ("namespace", 2, _STRING, _ONE, ""),
        ("containers", 3, _MESSAGE, _MANY, "ContainerResources"),
        ("cpu_ids", 4, _INT64, _MANY, ""),
        ("memory", 5, _MESSAGE, _MANY, "ContainerMemory"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, _ONE, ""),
        ("devices", 2, _MESSAGE, _MANY, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, _MANY, ""),
        ("memory", 4, _MESSAGE, _MANY, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, _MANY, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _STRING, _ONE, ""),
        ("size", 2, _UINT64, _ONE, ""),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, _ONE, ""),
        ("device_ids", 2, _STRING, _MANY, ""),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, "NUMANode")],
    "NUMANode": [("ID", 1, _INT64, _ONE, "")],
    "DynamicResource": [
        ("claim_name", 2, _STRING, _ONE, ""),
        ("claim_namespace", 3, _STRING, _ONE, ""),
        ("claim_resources", 4, _MESSAGE, _MANY, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _MESSAGE, _MANY, "CDIDevice"),
        ("driver_name", 2, _STRING, _ONE, ""),
        ("pool_name", 3, _STRING, _ONE, ""),
        ("device_name", 4, _STRING, _ONE, ""),
        ("share_id", 5, _STRING, _ONE, ""),  # proto3 `optional`: a one-field oneof, set below
    ],
    "CDIDevice": [("name", 1, _STRING, _ONE, "")],
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="gpu_exporter_tests/podresources_v1.proto", package="v1")
    proto.syntax = "proto3"
    for name, fields in _SCHEMA.items():
        message = proto.message_type.add(name=name)
        for field, number, type_, label, type_name in fields:
            entry = message.field.add(name=field, number=number, type=type_, label=label)
            if type_name:
                entry.type_name = f".v1.{type_name}"
            if name == "ClaimResource" and field == "share_id":
                message.oneof_decl.add(name="_share_id")
                entry.oneof_index = 0
                entry.proto3_optional = True
    service = proto.service.add(name="PodResourcesLister")
    service.method.add(
        name="List", input_type=".v1.ListPodResourcesRequest", output_type=".v1.ListPodResourcesResponse"
    )
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())


def message(name: str) -> Any:
    """The generated class of a v1 message, e.g. ``message("ListPodResourcesResponse")``."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"v1.{name}"))
