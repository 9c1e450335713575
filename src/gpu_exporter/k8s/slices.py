"""DRA devices by UUID from the API server's ResourceSlices: opt-in (``--k8s.resource-slices``), and only
where a service-account token is mounted.

The node's CDI specs resolve NVIDIA's claim devices offline (``cdi.py``); a driver whose specs name no
device node or UUID still publishes each device's attributes in the ResourceSlices of its node, where
NVIDIA's driver (and others following it) sets a ``uuid`` attribute on every GPU and static MIG device.
The slices of this node are listed once per refresh interval and only while a claim device is left
unresolved by the specs; ``resource.k8s.io`` v1 (Kubernetes 1.34+) is tried first, then v1beta2 and
v1beta1 (whose attributes sit under ``basic``). Listing ResourceSlices needs a ClusterRole (``list`` on
``resourceslices``): the slices are cluster-scoped objects, filtered here by ``spec.nodeName``.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from gpu_exporter.k8s.listing import fetch_items

__all__ = ["ResourceSlices", "api_url", "index_slices"]

log = logging.getLogger(__name__)

VERSIONS = ("v1", "v1beta2", "v1beta1")


def api_url(configured: str, environ: dict[str, str] | None = None) -> str:
    """The API server's URL: the option, else the in-cluster service's address ("" when neither)."""
    if configured:
        return configured.rstrip("/")
    env = os.environ if environ is None else environ
    host, port = env.get("KUBERNETES_SERVICE_HOST", ""), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _uuid(device: dict[str, Any]) -> str:
    attributes = device.get("attributes")
    basic = device.get("basic")
    if not isinstance(attributes, dict) and isinstance(basic, dict):  # v1beta1
        attributes = basic.get("attributes")
    for name, value in (attributes or {}).items() if isinstance(attributes, dict) else ():
        if isinstance(name, str) and (name == "uuid" or name.endswith("/uuid")) and isinstance(value, dict):
            text = value.get("string")
            if isinstance(text, str) and text.startswith(("GPU-", "MIG-")):
                return text
    return ""


def index_slices(items: list[Any]) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> GPU or MIG UUID, for the devices that carry a ``uuid`` attribute."""
    out: dict[tuple[str, str, str], str] = {}
    for item in items:
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(spec, dict):
            continue
        pool = spec.get("pool")
        driver, pool_name = str(spec.get("driver") or ""), str(pool.get("name") or "") if isinstance(pool, dict) else ""
        devices = spec.get("devices")
        for device in devices if isinstance(devices, list) else ():
            if isinstance(device, dict) and isinstance(device.get("name"), str) and (uuid := _uuid(device)):
                out[(driver, pool_name, device["name"])] = uuid
    return out


class ResourceSlices:
    def __init__(
        self,
        url: str,
        token_file: str,
        ca_file: str,
        node: str,
        refresh: float,
        error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._token_file = token_file
        self._ca_file = ca_file
        self._node = node
        self._refresh = refresh
        self._error = error
        self._clock = clock
        self._asked_at = float("-inf")
        self._index: dict[tuple[str, str, str], str] = {}
        self._version = ""
        self._said: set[str] = set()

    def uuid(self, driver: str, pool: str, device: str) -> str:
        return self._index.get((driver, pool, device), "")

    def refresh(self) -> None:
        """List this node's slices if the last list is older than the refresh interval."""
        now = self._clock()
        if now - self._asked_at < self._refresh:
            return
        self._asked_at = now
        if not self._url:
            return self._say("no API server address (KUBERNETES_SERVICE_HOST unset, k8s.api-url empty)")
        if not os.path.exists(self._token_file):
            return self._say(f"no service-account token at {self._token_file}")
        query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={self._node}"})
        problem = ""
        for version in (self._version,) if self._version else VERSIONS:
            url = f"{self._url}/apis/resource.k8s.io/{version}/resourceslices?{query}"
            try:
                items = fetch_items(url, self._token_file, self._ca_file, "ResourceSliceList")
            except ValueError as exc:
                problem = str(exc)
                continue
            self._version = version
            self._index = index_slices(items)
            return None
        self._version = ""  # none answered: try every version again next time
        self._error()
        self._say(problem)
        return None

    def _say(self, problem: str) -> None:
        if problem not in self._said and len(self._said) < 16:  # a handful of distinct problems, once each
            self._said.add(problem)
            log.warning("ResourceSlices not read: %s; DRA devices are resolved from CDI specs only", problem)
