"""Chosen pod labels for the per-pod series, read on the node, never from the API server.

Two sources answer a list of the node's own pods with their labels, as a Kubernetes ``PodList``:

- the kubelet's ``/pods``: on its read-only port (``http://127.0.0.1:10255/pods``, off by default in
  most distributions) or on its authenticated port (``https://127.0.0.1:10250/pods``, with a
  service-account token allowed ``nodes/proxy`` and the kubelet's serving certificate as CA);
- KubeEdge's MetaServer on the edge node (``http://127.0.0.1:10550/api/v1/pods``, EdgeCore's
  ``metaManager.metaServer.enable: true``), which answers from EdgeCore's local store, also offline.

Only label keys that fully match ``k8s.pod-labels`` are kept, as ``label_<key>`` with every character
outside ``[a-zA-Z0-9_]`` made ``_`` (as kube-state-metrics names them). At most ``max_labels`` per pod
(by key) and values of at most ``max_length`` characters are kept; every label left out or cut is
counted once per pod and key (``gpu_exporter_k8s_pod_labels_cut_total{reason}``). The list is asked once
per refresh interval, bounded in time and in bytes; a failing source keeps the labels of its last answer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_exporter.k8s.listing import fetch_items
from gpu_exporter.limits import MAX_NAME, bound_value

__all__ = ["PodLabelSource", "select_labels"]

log = logging.getLogger(__name__)

_INVALID = re.compile(r"[^a-zA-Z0-9_]")

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Cut:
    pod: str  # uid, or namespace/name
    key: str
    reason: str  # count, length, name


def select_labels(
    labels: dict[str, Any], allow: re.Pattern[str], max_labels: int, max_length: int, pod: str
) -> tuple[Labels, list[Cut]]:
    """The allowed labels of one pod as (label_<key>, value) pairs, and what was cut."""
    out: list[tuple[str, str]] = []
    cuts: list[Cut] = []
    names: set[str] = set()
    for key in sorted(k for k in labels if isinstance(k, str) and allow.fullmatch(k)):
        value = labels[key] if isinstance(labels[key], str) else str(labels[key])
        name = "label_" + _INVALID.sub("_", key)
        # app.kubernetes.io/name and app_kubernetes_io/name give one name: the first by key wins
        if name in names or len(name) > MAX_NAME:
            cuts.append(Cut(pod, key, "name"))
            continue
        if len(out) >= max_labels:
            cuts.append(Cut(pod, key, "count"))
            continue
        if len(value) > max_length:
            value = value[:max_length]
            cuts.append(Cut(pod, key, "length"))
        names.add(name)
        out.append((name, bound_value(value)))
    return tuple(out), cuts


class PodLabelSource:
    """Fetches the node's pod list every ``refresh`` seconds; labels by pod UID and by namespace/name."""

    def __init__(
        self,
        url: str,
        allow: str,
        max_labels: int,
        max_length: int,
        refresh: float,
        token_file: str = "",
        ca_file: str = "",
        count: Callable[[str, int], None] = lambda reason, n: None,
        error: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._allow = re.compile(allow)
        self._max_labels = max_labels
        self._max_length = max_length
        self._refresh = refresh
        self._token_file = token_file
        self._ca_file = ca_file
        self._count = count
        self._error = error
        self._clock = clock
        self._asked_at = float("-inf")
        self._by_uid: dict[str, Labels] = {}
        self._by_name: dict[tuple[str, str], Labels] = {}
        self._cut: set[Cut] = set()
        self._failed = False

    def labels(self, namespace: str, pod: str, uid: str) -> Labels:
        found = self._by_uid.get(uid) if uid else None
        return found if found is not None else self._by_name.get((namespace, pod), ())

    def refresh(self) -> None:
        now = self._clock()
        if now - self._asked_at < self._refresh:
            return
        self._asked_at = now
        try:
            items = self._fetch()
        except ValueError as exc:
            self._error()
            if not self._failed:  # said once per outage, not once per refresh
                log.warning("pod labels from %s: %s; keeping the last ones", self._url, exc)
            self._failed = True
            return
        self._failed = False
        self._index(items)

    def _index(self, items: list[Any]) -> None:
        by_uid: dict[str, Labels] = {}
        by_name: dict[tuple[str, str], Labels] = {}
        cuts: set[Cut] = set()
        for item in items:
            meta = item.get("metadata") if isinstance(item, dict) else None
            if not isinstance(meta, dict):
                continue
            name, namespace, uid = (str(meta.get(k) or "") for k in ("name", "namespace", "uid"))
            raw = meta.get("labels")
            labels, cut = select_labels(
                raw if isinstance(raw, dict) else {},
                self._allow,
                self._max_labels,
                self._max_length,
                uid or f"{namespace}/{name}",
            )
            cuts.update(cut)
            if uid:
                by_uid[uid] = labels
            by_name[(namespace, name)] = labels
        for reason in ("count", "length", "name"):
            new = sum(1 for c in cuts - self._cut if c.reason == reason)
            if new:
                self._count(reason, new)
        self._cut = cuts  # only the pods listed now: bounded by the node's pods
        self._by_uid, self._by_name = by_uid, by_name

    def _fetch(self) -> list[Any]:
        return fetch_items(self._url, self._token_file, self._ca_file, "PodList")
