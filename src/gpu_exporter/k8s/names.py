"""Names for pod UIDs and container IDs from the kubelet's log directories, re-indexed as needed.

The index (``podlogs.scan``) is rebuilt every refresh interval, and at once (at most once a second) for
a pod not seen yet or a new container (a restart) in a pod of several. One the directories still do not
name (a pod whose directory is gone, a link never written) is looked for again after 1 s, 2 s, 4 s ...
up to the refresh interval, so that such processes cannot keep the directories re-read every second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gpu_exporter.k8s import cgroup, podlogs
from gpu_exporter.k8s.model import PodRef

__all__ = ["PodNames"]

log = logging.getLogger(__name__)

_AT_ONCE_EVERY = 1.0  # seconds between re-indexings for an unknown pod or container


class PodNames:
    def __init__(self, logs_path: str, refresh: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = logs_path
        self._refresh = refresh
        self._clock = clock
        self.directory = podlogs.PodDirectory()
        self._scanned_at = float("-inf")
        # what the scans did not name -> (when to look again, the wait after that)
        self._missing: dict[tuple[str, str], tuple[float, float]] = {}
        self._said_truncated = False

    def name(self, found: cgroup.ContainerCgroup) -> PodRef | None:
        """The container a cgroup path names, or None for a pod the directories do not know."""
        now = self._clock()
        stale = now - self._scanned_at >= self._refresh
        directory = self.directory
        pod = directory.pods.get(found.pod_uid)
        new_container = (
            pod is not None
            and bool(found.container_id)
            and found.container_id not in directory.containers
            and len(directory.container_names(found.pod_uid)) > 1
        )
        key = (found.pod_uid, found.container_id)
        if stale or ((pod is None or new_container) and self._due(key, now)):
            self._rescan(now, clear=stale)
            if self.directory.pods.get(found.pod_uid) is None or (
                found.container_id and found.container_id not in self.directory.containers
            ):
                self._miss(key, now)
        names = self.directory.names(found.pod_uid, found.container_id)
        return PodRef(*names) if names else None

    def uid(self, pod: PodRef) -> str:
        """A pod's UID from its log directory's name ("" when there is none)."""
        key = (pod.namespace, pod.pod)
        uid = self.directory.uids.get(key)
        missing, now = (f"{pod.namespace}/{pod.pod}", ""), self._clock()
        if uid is None and self._due(missing, now):  # a pod the kubelet lists, new to us
            self._rescan(now, clear=False)
            uid = self.directory.uids.get(key)
            if uid is None:
                self._miss(missing, now)
        return uid or ""

    def _due(self, key: tuple[str, str], now: float) -> bool:
        if now - self._scanned_at < _AT_ONCE_EVERY:
            return False
        found = self._missing.get(key)
        return found is None or now >= found[0]

    def _miss(self, key: tuple[str, str], now: float) -> None:
        wait = self._missing[key][1] if key in self._missing else 1.0
        self._missing[key] = (now + wait, min(2 * wait, self._refresh))

    def _rescan(self, now: float, clear: bool) -> None:
        self.directory = podlogs.scan(self._path)
        self._scanned_at = now
        if clear:  # a scan of the refresh interval: every pod is looked for again
            self._missing = {}
        if self.directory.truncated and not self._said_truncated:
            self._said_truncated = True
            log.warning(
                "%s or its containers/ has more than %d entries; only the first are read",
                self._path,
                podlogs.MAX_ENTRIES,
            )
