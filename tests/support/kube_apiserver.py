"""A stand-in Kubernetes API server on 127.0.0.1 that records what it is sent, for `helm install`.

Helm renders a chart only inside its install, which sends the rendered objects to an API server. This
server answers what that install asks (legacy discovery: /version, /api, /apis and each group version's
resource list; get, list, create, update and patch of objects) from an in-memory store, and records every
object created, so that a test gets exactly the manifests Helm rendered, as Helm sent them. It checks
nothing a real API server would (no admission, no schema, no defaults): the tests validate the objects
themselves. Plain HTTP, no authentication; ``kubeconfig()`` writes a file that points a client at it.

The resources it serves are the ones in ``RESOURCES``: the chart's kinds, the release's Secret and the
Prometheus Operator's two (their CRDs are what a cluster with the operator has). Anything else is a 404,
as for a kind whose CRD is not installed.
"""

from __future__ import annotations

import base64
import copy
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["RESOURCES", "ApiServer", "Resource"]

Obj = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    group_version: str  # "v1", "apps/v1"
    plural: str
    kind: str
    namespaced: bool = True


RESOURCES = (
    Resource("v1", "namespaces", "Namespace", namespaced=False),
    Resource("v1", "configmaps", "ConfigMap"),
    Resource("v1", "secrets", "Secret"),
    Resource("v1", "services", "Service"),
    Resource("v1", "serviceaccounts", "ServiceAccount"),
    Resource("apps/v1", "daemonsets", "DaemonSet"),
    Resource("apps/v1", "deployments", "Deployment"),
    Resource("policy/v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    Resource("monitoring.coreos.com/v1", "servicemonitors", "ServiceMonitor"),
    Resource("monitoring.coreos.com/v1", "prometheusrules", "PrometheusRule"),
)
KUBE_VERSION = {"major": "1", "minor": "30", "gitVersion": "v1.30.0", "platform": "linux/amd64"}


def _status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


_PROTOBUF_MAGIC = b"k8s\x00"


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """Protocol buffers' wire format: (field number, varint or length-delimited bytes)."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield number, value
        elif wire == 2:
            size, i = _varint(data, i)
            yield number, data[i : i + size]
            i += size
        else:
            raise ValueError(f"protobuf wire type {wire} is not used by the objects served here")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def _entries(field: bytes) -> tuple[str, bytes]:
    parts = {n: v for n, v in _fields(field) if isinstance(v, bytes)}
    return parts.get(1, b"").decode(), parts.get(2, b"")


def _secret_from_protobuf(raw: bytes) -> Obj:
    """A Secret sent in Kubernetes' protobuf envelope (client-go's typed clients send Helm's release record
    so), as the JSON object it stands for: name, namespace, labels, data and type."""
    envelope = {n: v for n, v in _fields(raw[len(_PROTOBUF_MAGIC) :]) if isinstance(v, bytes)}
    meta: Obj = {"labels": {}}
    secret: Obj = {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": {}}
    for number, value in _fields(envelope.get(2, b"")):  # runtime.Unknown's raw: the v1.Secret
        if number == 1 and isinstance(value, bytes):  # metadata
            for field, item in _fields(value):
                if field in (1, 3) and isinstance(item, bytes):
                    meta["name" if field == 1 else "namespace"] = item.decode()
                elif field == 11 and isinstance(item, bytes):
                    key, text = _entries(item)
                    meta["labels"][key] = text.decode()
        elif number == 2 and isinstance(value, bytes):
            key, blob = _entries(value)
            secret["data"][key] = base64.b64encode(blob).decode()
        elif number == 3 and isinstance(value, bytes):
            secret["type"] = value.decode()
    return secret


def _selected(obj: Obj, selector: str) -> bool:
    """An equality label selector (a=b,c=d, or a==b), as Helm's release storage sends."""
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.replace("==", "=").partition("=")
        if labels.get(key) != value:
            return False
    return True


class _Store:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[tuple[str, str, str, str], Obj] = {}  # (group version, plural, namespace, name)
        self.created: list[Obj] = []  # every object created, in order, as sent
        self.requests: list[str] = []  # "METHOD path", for a test's message when something went wrong
        self.version = 0

    def stamp(self, obj: Obj) -> Obj:
        self.version += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        meta["resourceVersion"] = str(self.version)
        return obj


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Obj:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if raw.startswith(_PROTOBUF_MAGIC):
            return _secret_from_protobuf(raw)
        body = json.loads(raw or b"{}")
        if not isinstance(body, dict):
            raise ValueError("the request body is not an object")
        return body

    def _route(self) -> tuple[Resource, str, str | None] | None:
        """(resource, namespace, name or None) for an object path; None for anything else."""
        parts = [p for p in urlsplit(self.path).path.split("/") if p]
        if parts[:1] == ["api"]:
            gv, rest = parts[1], parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 3:
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return None
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 2:
            return None
        for res in RESOURCES:
            if res.group_version == gv and res.plural == rest[0]:
                return res, namespace, rest[1] if len(rest) == 2 else None
        return None

    def _discovery(self, path: str) -> Obj | None:
        if path == "/version":
            return KUBE_VERSION
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        groups: dict[str, list[str]] = {}
        for res in RESOURCES:
            if "/" in res.group_version:
                group, version = res.group_version.split("/")
                groups.setdefault(group, [])
                if version not in groups[group]:
                    groups[group].append(version)
        if path == "/apis":
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                        "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
                    }
                    for group, versions in groups.items()
                ],
            }
        gv = path.removeprefix("/api/") if path.startswith("/api/") else path.removeprefix("/apis/")
        listed = [res for res in RESOURCES if res.group_version == gv]
        if not listed:
            return None
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {"name": r.plural, "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": verbs}
                for r in listed
            ],
        }

    def _handle(self) -> None:
        store = self.server.store
        with store.lock:
            store.requests.append(f"{self.command} {self.path}")
        url = urlsplit(self.path)
        if self.command == "GET":
            found = self._discovery(url.path.rstrip("/"))
            if found is not None:
                self._send(200, found)
                return
        route = self._route()
        if route is None:
            self._send(404, _status(404, "NotFound", f"the server could not find the requested resource ({url.path})"))
            return
        res, namespace, name = route
        query = parse_qs(url.query)
        with store.lock:
            if self.command == "GET" and name is None:
                items = [
                    copy.deepcopy(o)
                    for (gv, plural, ns, _), o in sorted(store.objects.items())
                    if (gv, plural) == (res.group_version, res.plural)
                    and (not namespace or ns == namespace)
                    and _selected(o, query.get("labelSelector", [""])[0])
                ]
                listing = {"kind": f"{res.kind}List", "apiVersion": res.group_version, "items": items}
                self._send(200, {**listing, "metadata": {"resourceVersion": str(store.version)}})
                return
            if self.command == "POST" and name is None:
                obj = self._body()
                obj.setdefault("metadata", {})
                if res.namespaced and not obj["metadata"].get("namespace"):
                    obj["metadata"]["namespace"] = namespace
                key = (res.group_version, res.plural, namespace, obj["metadata"].get("name", ""))
                if key in store.objects:
                    self._send(409, _status(409, "AlreadyExists", f'{res.plural} "{key[3]}" already exists'))
                    return
                if "dryRun" not in query:
                    store.created.append(copy.deepcopy(obj))
                    store.objects[key] = store.stamp(obj)
                self._send(201, store.objects.get(key, obj))
                return
            if name is None:
                self._send(405, _status(405, "MethodNotAllowed", f"{self.command} on a collection"))
                return
            key = (res.group_version, res.plural, namespace, name)
            current = store.objects.get(key)
            if current is None and self.command != "PATCH":
                self._send(404, _status(404, "NotFound", f'{res.plural} "{name}" not found'))
                return
            if self.command == "GET":
                self._send(200, current or {})
            elif self.command == "PUT":
                store.objects[key] = store.stamp(self._body())
                self._send(200, store.objects[key])
            elif self.command == "DELETE":
                del store.objects[key]
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
            else:  # PATCH: recorded, not merged; the chart's objects are only ever created
                self._send(
                    422, _status(422, "Invalid", f"the stand-in does not patch ({self.headers['Content-Type']})")
                )

    def _guarded(self) -> None:
        try:
            self._handle()
        except (ValueError, KeyError) as err:
            self._send(400, _status(400, "BadRequest", str(err)))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _guarded


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: _Store


class ApiServer:
    """The stand-in, serving on a free port of 127.0.0.1 from a thread while the ``with`` block runs."""

    def __init__(self) -> None:
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.store = _Store()
        self._thread = threading.Thread(target=self._server.serve_forever, name="kube-apiserver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig whose one context is this server (JSON is YAML too)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {}}],
            "contexts": [
                {"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in", "namespace": namespace}}
            ],
            "current-context": "stand-in",
        }
        path.write_text(json.dumps(config), encoding="utf-8")
        return path

    @property
    def created(self) -> list[Obj]:
        """Every object created, in the order Helm sent them, as sent (Helm's release Secret among them)."""
        with self._server.store.lock:
            return copy.deepcopy(self._server.store.created)

    @property
    def requests(self) -> list[str]:
        with self._server.store.lock:
            return list(self._server.store.requests)
