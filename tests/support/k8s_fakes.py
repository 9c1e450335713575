"""Test doubles at the Kubernetes boundary: a fake kubelet pod-resources gRPC server on a unix socket.

Its answers are ``v1.ListPodResourcesResponse`` messages built and serialised by Google's protobuf
runtime from the kubelet's v1 schema (``podresources_pb.py``), device-plugin devices and DRA claims
alike, so the decoder under test meets the real wire format, not one written by the same hand.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from tests.support.podresources_pb import message


@dataclass(frozen=True)
class ClaimResource:
    """One device of a claim, as the kubelet reports it (``ClaimResource``)."""

    device: str  # e.g. gpu-0
    cdi_devices: Sequence[str] = ()
    driver: str = "gpu.nvidia.com"
    pool: str = "node-1"
    share_id: str | None = None


@dataclass(frozen=True)
class Claim:
    """A ResourceClaim prepared for a container (``DynamicResource``)."""

    name: str
    namespace: str
    resources: Sequence[ClaimResource] = field(default_factory=tuple)


# (container name, [(resource name, [device ids])]) or the same with a third item, its DRA claims
Container = (
    tuple[str, Sequence[tuple[str, Sequence[str]]]] | tuple[str, Sequence[tuple[str, Sequence[str]]], Sequence[Claim]]
)
# (pod name, namespace, containers)
Pod = tuple[str, str, Sequence[Container]]


def encode_response(pods: Sequence[Pod], cpu_ids: Sequence[int] = (3, 4)) -> bytes:
    """A ListPodResourcesResponse. Each container also gets cpu_ids, memory and topology, which readers skip."""
    response = message("ListPodResourcesResponse")()
    for name, namespace, containers in pods:
        pod = response.pod_resources.add(name=name, namespace=namespace)
        pod.cpu_ids.extend(cpu_ids)
        for container_spec in containers:
            container = pod.containers.add(name=container_spec[0])
            for resource, ids in container_spec[1]:
                devices = container.devices.add(resource_name=resource)
                devices.device_ids.extend(ids)
                devices.topology.nodes.add(ID=0)
            container.cpu_ids.extend(cpu_ids)
            container.memory.add(memory_type="memory", size=1 << 30).topology.nodes.add(ID=0)
            claims: Sequence[Claim] = container_spec[2] if len(container_spec) > 2 else ()  # type: ignore[misc]
            for claim in claims:
                dynamic = container.dynamic_resources.add(claim_name=claim.name, claim_namespace=claim.namespace)
                for res in claim.resources:
                    entry = dynamic.claim_resources.add(
                        driver_name=res.driver, pool_name=res.pool, device_name=res.device
                    )
                    if res.share_id is not None:
                        entry.share_id = res.share_id
                    for cdi in res.cdi_devices:
                        entry.cdi_devices.add(name=cdi)
    data: bytes = response.SerializeToString()
    return data


class FakeKubelet:
    """Serves ``v1.PodResourcesLister/List`` on a unix socket; ``pods`` and ``fail`` can change live."""

    def __init__(self) -> None:
        # unix socket paths are limited to ~107 bytes: keep the directory short
        self.directory = Path(tempfile.mkdtemp(prefix="kl", dir="/tmp"))
        self.socket = str(self.directory / "kubelet.sock")
        self.pods: list[Pod] = []
        self.fail: grpc.StatusCode | None = None
        self.detail = "kubelet is unhappy"
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister", {"List": grpc.unary_unary_rpc_method_handler(self._list)}
        )
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{self.socket}")

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.calls += 1
        message("ListPodResourcesRequest").FromString(request)  # the request the real kubelet parses
        if self.fail is not None:
            context.abort(self.fail, self.detail)
        return encode_response(self.pods)

    def start(self) -> FakeKubelet:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(0).wait(5)
        shutil.rmtree(self.directory, ignore_errors=True)


class FakePodList:
    """A node's pod list over HTTP on 127.0.0.1, as the kubelet's ``/pods`` or KubeEdge's MetaServer
    answer it (a ``PodList``); ``pods``, ``status``, ``body`` and ``token`` can change live."""

    def __init__(self, path: str = "/pods") -> None:
        import http.server
        import json
        import threading

        self.path = path
        self.pods: list[dict[str, object]] = []
        self.status = 200
        self.body: bytes | None = None  # served as it is instead of the pod list
        self.token = ""  # when set, a request must carry it as a bearer token
        self.calls = 0
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.calls += 1
                wanted = f"Bearer {fake.token}"
                if self.path.split("?")[0] != fake.path:
                    self.send_error(404)
                elif fake.token and self.headers.get("Authorization") != wanted:
                    self.send_error(401)
                else:
                    body = fake.body
                    if body is None:
                        body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": fake.pods}).encode()
                    self.send_response(fake.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}{path}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-pod-list", daemon=True)

    @staticmethod
    def pod(name: str, namespace: str, uid: str, labels: dict[str, str]) -> dict[str, object]:
        meta: dict[str, object] = {"name": name, "namespace": namespace, "uid": uid, "labels": labels}
        return {"metadata": meta, "spec": {"nodeName": "node-1", "containers": [{"name": "main"}]}, "status": {}}

    def start(self) -> FakePodList:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
