"""What the vendor-library backends share: guarded calls and lost-device backoff.

Each backend keeps its own mapping from the vendor's exceptions to a ``Fault``; this module decides
what a fault means: a call the device does not support is not asked again on that device, a function
the library lacks is logged once and not asked again at all, failures are counted by call name, and a
device that stops answering is skipped with exponential backoff until it can be attached again.
"""

from __future__ import annotations

import enum
import logging
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from gpu_exporter.model import DeviceId

__all__ = ["RETRY_MAX", "Backoff", "CallGuard", "Fault", "Liveness", "Lost"]

RETRY_MAX = 300.0  # seconds: the longest wait between attempts to reach a lost device

T = TypeVar("T")
D = TypeVar("D", bound="Tracked")


class Lost(Exception):
    """The device stopped answering; the rest of its cycle is skipped."""


class Fault(enum.Enum):
    UNSUPPORTED = enum.auto()  # the device cannot answer this call: not asked again on it
    MISSING = enum.auto()  # the library lacks the function: logged once, not asked again
    LOST = enum.auto()  # the device stopped answering: counted, raises Lost
    EMPTY = enum.auto()  # nothing to report right now: not an error
    ERROR = enum.auto()  # anything else: counted, asked again next cycle


class CallGuard:
    """Runs vendor calls, remembering what not to ask again and counting failures by call name.

    ``classify`` maps a raised exception to a Fault, or to None for one that is not the vendor's
    (it propagates). ``describe`` renders an exception for logs and the Lost reason.
    """

    def __init__(
        self,
        log: logging.Logger,
        classify: Callable[[Exception], Fault | None],
        missing_message: str,
        *,
        missing_level: int = logging.WARNING,
        describe: Callable[[Exception], str] = str,
    ) -> None:
        self.errors: Counter[str] = Counter()
        self._log = log
        self._classify = classify
        self._describe = describe
        self._missing_message = missing_message  # %s: the function name
        self._missing_level = missing_level
        self._unsupported: set[tuple[Hashable, str]] = set()
        self._missing: set[str] = set()

    def call(
        self, scope: Hashable, name: str, fn: Callable[..., Any] | None, *args: Any, variant: str = "", **kwargs: Any
    ) -> Any:
        """``fn(*args, **kwargs)``, or None when the value is unavailable (``fn`` None: missing). Raises Lost.

        ``name`` counts errors and marks a function missing; ``variant`` tells apart uses of one
        function whose support differs per device (a sensor, a clock domain).
        """
        key = f"{name}:{variant}" if variant else name
        if name in self._missing or (scope, key) in self._unsupported:
            return None
        if fn is None:
            self._mark_missing(name)
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            fault = self._classify(exc)
            if fault is None:
                raise
            if fault is Fault.UNSUPPORTED:
                self._unsupported.add((scope, key))
                self._log.debug("GPU %s: %s not supported", scope, key)
            elif fault is Fault.MISSING:
                self._mark_missing(name)
            elif fault is not Fault.EMPTY:
                self.errors[name] += 1
                if fault is Fault.LOST:
                    raise Lost(f"{name}: {self._describe(exc)}") from None
                self._log.debug("GPU %s: %s failed: %s", scope, key, self._describe(exc))
        return None

    def is_missing(self, name: str) -> bool:
        """Whether the library was found to lack ``name``."""
        return name in self._missing

    def _mark_missing(self, name: str) -> None:
        self._missing.add(name)
        self._log.log(self._missing_level, self._missing_message, name)


@dataclass
class Liveness:
    """Whether a device answers, and when a lost one is next tried."""

    up: bool = False
    retry_at: float = 0.0
    backoff: float = 0.0


class Tracked(Protocol):
    id: DeviceId
    live: Liveness


class Backoff:
    """Skips a lost device until its retry is due, then attaches it again.

    The wait starts at ``initial`` seconds, doubles while the device stays lost, stops growing at
    RETRY_MAX, and starts over once the device answers. Each transition is logged once.
    """

    def __init__(self, log: logging.Logger, initial: float, clock: Callable[[], float]) -> None:
        self._log = log
        self._initial = initial
        self._clock = clock

    def poll(self, device: D, now: float, attach: Callable[[D], None], read: Callable[[D], T]) -> T | None:
        """``read(device)`` when it is up or due a retry (attached first); None while it is down."""
        live = device.live
        if not live.up and now < live.retry_at:
            return None
        try:
            if not live.up:
                attach(device)
                self._log.warning("GPU %s (%s) is back", device.id.gpu, device.id.uuid)
            result = read(device)
        except Lost as exc:
            self.lost(device, str(exc))
            return None
        live.up = True
        live.backoff = 0.0
        return result

    def lost(self, device: Tracked, why: str) -> None:
        live = device.live
        if live.up or live.backoff == 0.0:
            self._log.warning(
                "GPU %s (%s) is not answering (%s); retrying with backoff",
                device.id.gpu,
                device.id.uuid or "unknown uuid",
                why,
            )
        live.up = False
        live.backoff = min(RETRY_MAX, live.backoff * 2 or self._initial)
        live.retry_at = self._clock() + live.backoff
