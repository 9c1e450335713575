"""Test doubles at the Kubernetes boundary: a fake kubelet pod-resources gRPC server on a unix socket.

The server encodes its responses with the small protobuf writer below, written independently of the
decoder under test, from the field numbers of the kubelet's podresources v1 api.proto.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc

# (container name, [(resource name, [device ids])])
Container = tuple[str, Sequence[tuple[str, Sequence[str]]]]
# (pod name, namespace, containers)
Pod = tuple[str, str, Sequence[Container]]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def encode_response(pods: Sequence[Pod], cpu_ids: Sequence[int] = (3, 4)) -> bytes:
    """A ListPodResourcesResponse. Each container also gets cpu_ids (field 3), which readers skip."""
    out = b""
    for name, namespace, containers in pods:
        pod = _len_field(1, name.encode()) + _len_field(2, namespace.encode())
        for container_name, devices in containers:
            container = _len_field(1, container_name.encode())
            for resource, ids in devices:
                device = _len_field(1, resource.encode())
                for device_id in ids:
                    device += _len_field(2, device_id.encode())
                # TopologyInfo { repeated NUMANode nodes = 1 { int64 ID = 1 } }
                device += _len_field(3, _len_field(1, _int_field(1, 0)))
                container += _len_field(2, device)
            for cpu in cpu_ids:
                container += _int_field(3, cpu)
            pod += _len_field(3, container)
        out += _len_field(1, pod)
    return out


class FakeKubelet:
    """Serves ``v1.PodResourcesLister/List`` on a unix socket; ``pods`` and ``fail`` can change live."""

    def __init__(self) -> None:
        # unix socket paths are limited to ~107 bytes: keep the directory short
        self.directory = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
        self.socket = str(self.directory / "kubelet.sock")
        self.pods: list[Pod] = []
        self.fail: grpc.StatusCode | None = None
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(self._list)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{self.socket}")

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        if self.fail is not None:
            context.abort(self.fail, "kubelet is unhappy")
        return encode_response(self.pods)

    def start(self) -> FakeKubelet:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(0).wait(5)
        shutil.rmtree(self.directory, ignore_errors=True)
