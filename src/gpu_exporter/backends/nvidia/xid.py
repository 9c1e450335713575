"""XID errors from NVML events, on a thread of their own that waits on the driver's event set.

Counted per (GPU, XID code) since the agent started, and the code of each GPU's latest XID kept for
dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS``. The sampler reads both under a lock once per cycle.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["XidEvents", "handle_address"]

log = logging.getLogger("gpu_exporter.backends.nvml")


def handle_address(handle: Any) -> int | None:
    """The address a handle (a ctypes pointer) holds; None for NULL or what is not a pointer.

    Events name their device by a handle of their own: pynvml's handles are unhashable and equal only
    to themselves, but NVML keeps one address per device while it runs.
    """
    try:
        return ctypes.addressof(handle.contents)
    except (AttributeError, TypeError, ValueError):  # not a pointer; NULL
        return None


class XidEvents:
    def __init__(self, nv: Any, errors: Counter[str], wait_ms: int) -> None:
        self._nv = nv
        self._errors = errors
        self._wait_ms = wait_ms  # how long one event wait blocks; bounds the time stop() takes
        self._lock = threading.Lock()
        self._counts: Counter[tuple[int, int]] = Counter()
        self._last: dict[int, int] = {}  # device index -> code of its latest XID
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, handles: Iterable[tuple[int, Any]]) -> None:
        """Watch the devices given as (index, handle)."""
        self._thread = threading.Thread(target=self._loop, args=(list(handles),), name="nvml-xid", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the thread waiting on the driver's events is alive."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def read(self, index: int) -> tuple[dict[int, int], int]:
        """(count per XID code, latest code or 0) for one GPU."""
        with self._lock:
            counts = {xid: n for (i, xid), n in self._counts.items() if i == index}
            return counts, self._last.get(index, 0)

    def _loop(self, handles: list[tuple[int, Any]]) -> None:
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("XID events unavailable: %s", exc)
            return
        by_address: dict[int, int] = {}
        for index, handle in handles:
            try:
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
                by_address[handle_address(handle) or 0] = index
            except nv.NVMLError as exc:
                log.info("GPU %d: XID events unavailable: %s", index, exc)
        try:
            while not self._stop.is_set() and by_address:
                try:
                    data = nv.nvmlEventSetWait_v2(event_set, self._wait_ms)
                except nv.NVMLError_Timeout:
                    continue
                except nv.NVMLError as exc:
                    self._errors["nvmlEventSetWait_v2"] += 1
                    log.debug("XID wait failed: %s", exc)
                    self._stop.wait(1.0)
                    continue
                found = by_address.get(handle_address(data.device) or -1)
                if found is None:
                    continue
                xid = int(data.eventData)
                log.warning("GPU %d: XID %d", found, xid)
                with self._lock:
                    self._counts[(found, xid)] += 1
                    self._last[found] = xid
        finally:
            try:
                nv.nvmlEventSetFree(event_set)
            except nv.NVMLError:
                pass
