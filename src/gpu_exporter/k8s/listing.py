"""A Kubernetes-style list (``{"items": [...]}``) fetched over HTTP(S), bounded in time and bytes.

Used for the node's pod list (the kubelet's ``/pods``, KubeEdge's MetaServer) and, where enabled, the
API server's ResourceSlices. No proxy from the environment is used: these endpoints are on the node or
in the cluster. Every failure is a ``ValueError`` with a one-line message.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from typing import Any

from gpu_exporter import hostread

__all__ = ["MAX_BYTES", "TIMEOUT", "fetch_items"]

MAX_BYTES = 16 * 1024 * 1024  # a node's pods (110 with large specs are a few MB) or its slices
TIMEOUT = 3.0


def _token(path: str) -> str:
    try:  # bounded (hostread): a FIFO or a hung mount where the token should be costs the request, not the agent
        return hostread.read_text(path, cap=64 * 1024).strip()
    except OSError as exc:
        raise ValueError(f"cannot read the token file {path}: {exc.strerror or exc}") from None


def fetch_items(url: str, token_file: str = "", ca_file: str = "", what: str = "list") -> list[Any]:
    """The ``items`` of the JSON list at ``url``."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token_file:
        request.add_header("Authorization", f"Bearer {_token(token_file)}")
    context = None
    if url.startswith("https://"):
        try:
            context = ssl.create_default_context(cafile=ca_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"cannot use the CA file {ca_file}: {exc}") from None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(request, timeout=TIMEOUT) as response:
            data = response.read(MAX_BYTES + 1)
    except OSError as exc:  # URLError, HTTPError, timeouts, refused
        raise ValueError(" ".join(str(exc).split())[:200]) from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"the {what} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        raise ValueError("the answer is not JSON") from None
    items = body.get("items") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise ValueError(f"the answer is not a {what}")
    return items
