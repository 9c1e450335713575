"""Slow NVML calls off the critical path of the collect cycle.

Some calls block inside the driver: ``nvmlDeviceGetPcieThroughput`` samples the link for about 20 ms,
so a serial cycle of 8 GPUs spends a third of a second on it, and the last GPU's values are read long
after the sample's timestamp. The backend times every call of the reading phase; a call measured slower
than the budget in two cycles running is remembered (per device, with its arguments) and, from the
next cycle on, started on a worker thread as the cycle begins, all devices at once. When the serial pass reaches that call it
takes the worker's result (or its exception, handled exactly as if the call had been made in line), so
the values are the same and the cycle lasts about as long as the slowest call, not their sum.

A simple value (one number, scaled) whose early call is still running when the serial pass reaches it
is filled in at the end of the cycle instead, so the reads after it are not held up: every value of a
sample is read, or its call started, within a few milliseconds of the sample's timestamp.

A remembered call that the serial pass did not ask for again (its arguments changed, the device went
away) is forgotten; one that answered nothing (unsupported, failed) or that ran within the budget on its
worker (it was slow once, by accident: a pause of the process) goes back to the serial path. So a device
that stops answering keeps nothing: once back, its calls are measured again, on its new handles.
Calls with side effects or arguments that change every cycle are never started early.

A call is known by its device's scope (the GPU index, "0/mig3" for a MIG instance), its name and its
arguments with the device's handle left out, never by the handle: pynvml's handles are ctypes pointers,
which cannot be hashed (and compare by object, not by address).

Calls are timed with ``timer`` (``time.perf_counter`` in production). Tests over the simulated library
pass its clock of call costs (``SimNvml.timer``), so what is slow is the scenario's choice, not the
machine's load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["NEVER_EARLY", "SlowCalls"]

log = logging.getLogger("gpu_exporter.backends.nvml")

# side effects (GPM samples) or arguments that change every cycle (process samples since a timestamp)
NEVER_EARLY = frozenset(
    {
        "nvmlGpmSampleAlloc",
        "nvmlGpmSampleFree",
        "nvmlGpmSampleGet",
        "nvmlGpmMetricsGet",
        "nvmlDeviceGetProcessUtilization",
    }
)
_WORKERS_MAX = 64
_HANDLE = "<device handle>"  # stands for the call's device handle in its key

Key = tuple[Hashable, ...]


def _freeze(value: Any) -> Hashable:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value  # type: ignore[no-any-return]


def _timed(
    took: list[float], timer: Callable[[], float], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    started = timer()
    try:
        return fn(*args, **kwargs)
    finally:
        took.append(timer() - started)


class SlowCalls:
    """Calls measured slower than ``budget`` seconds; ``budget`` None keeps every call serial.

    A call is named by (scope, name) and told apart by its arguments, ``handle`` (the device's) left
    out; the arguments are frozen into a key only for names that have something remembered or started,
    so timing every call costs little. ``timer`` gives the seconds calls are measured in, on the reading
    thread and on the workers alike.
    """

    def __init__(self, budget: float | None, timer: Callable[[], float] = time.perf_counter) -> None:
        self.budget = budget
        self.timer = timer
        self._slow: dict[Key, tuple[Hashable, Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {}
        self._slow_names: set[tuple[Hashable, str]] = set()  # prefilter: may hold names since forgotten
        self._pending: dict[Key, Future[Any]] = {}
        self._ran: dict[Key, list[float]] = {}  # seconds each early call of this cycle took on its worker
        self._suspects: set[Key] = set()  # measured slow in line in the previous cycle
        self._suspects_now: set[Key] = set()  # ... and in this one
        self._pending_names: set[tuple[Hashable, str]] = set()
        self._unkeyed: set[str] = set()  # names whose arguments could not be made a key (logged once)
        self._pool: ThreadPoolExecutor | None = None
        self.started_early = 0  # calls run on a worker (read by tests and the bench)

    @property
    def enabled(self) -> bool:
        return self.budget is not None

    @property
    def pending(self) -> bool:
        """Whether calls were started early in this cycle."""
        return bool(self._pending)

    @property
    def remembered(self) -> bool:
        """Whether any call is remembered as slow."""
        return bool(self._slow)

    def _key(
        self, scope: Hashable, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], handle: Any
    ) -> Key | None:
        if name.partition(":")[0] in NEVER_EARLY:
            return None
        frozen = tuple(_HANDLE if handle is not None and a is handle else _freeze(a) for a in args)
        key: Key = (scope, name, frozen, _freeze(tuple(sorted(kwargs.items()))))
        try:
            hash(key)
        except TypeError:
            if name not in self._unkeyed:
                self._unkeyed.add(name)
                log.info("%s is slow but its arguments cannot be told apart; it stays in line", name.rstrip(":"))
            return None
        return key

    def slow(self) -> list[Key]:
        return list(self._slow)

    def begin(self, up: Callable[[Hashable], bool]) -> None:
        """Start every remembered call of the devices that are up; call at the start of a cycle."""
        if not self._slow:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=_WORKERS_MAX, thread_name_prefix="nvml-slow")
        for key, (scope, fn, args, kwargs) in self._slow.items():
            if up(scope):
                took: list[float] = []
                self._ran[key] = took
                self._pending[key] = self._pool.submit(_timed, took, self.timer, fn, args, kwargs)
                self._pending_names.add((scope, str(key[1])))
                self.started_early += 1

    def running(self, scope: Hashable, name: str, args: tuple[Any, ...], handle: Any) -> bool:
        """Whether the call was started early and has not answered yet."""
        if (scope, name) not in self._pending_names:
            return False
        future = self._pending.get(self._key(scope, name, args, {}, handle) or ())
        return future is not None and not future.done()

    def take(
        self, scope: Hashable, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], handle: Any
    ) -> Future[Any] | None:
        """The early call's future, if this call was started early in this cycle."""
        if (scope, name) not in self._pending_names:
            return None
        return self._pending.pop(self._key(scope, name, args, kwargs, handle) or (), None)

    def observe(
        self,
        scope: Hashable,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        handle: Any,
        seconds: float,
        answered: bool,
    ) -> None:
        """Remember a call that took longer than the budget; forget one that answered nothing."""
        if self.budget is None:
            return
        if not answered:
            if (scope, name) in self._slow_names:
                self._slow.pop(self._key(scope, name, args, kwargs, handle) or (), None)
        elif seconds > self.budget:
            key = self._key(scope, name, args, kwargs, handle)
            if key is None:
                return
            if key in self._suspects or key in self._slow:  # slow two cycles running: not a passing pause
                self._slow[key] = (scope, fn, args, dict(kwargs))
                self._slow_names.add((scope, name))
            else:
                self._suspects_now.add(key)

    def end(self) -> None:
        """Forget calls started for this cycle that nobody asked for, or that took no longer than the
        budget on their worker (a one-off hiccup of a fast call); call at the end of a cycle."""
        budget = self.budget if self.budget is not None else 0.0
        for key, took in self._ran.items():
            if key in self._pending or (took and took[0] <= budget):
                self._slow.pop(key, None)
        self._pending.clear()
        self._pending_names.clear()
        self._ran.clear()
        self._suspects, self._suspects_now = self._suspects_now, set()

    def close(self) -> None:
        """Stop the workers, waiting for a call still running (the library is shut down next)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._slow.clear()
        self._pending.clear()
        self._ran.clear()
