"""The simulator's throttle counters and per-call cost (mixed into ``backends.fake.backend.SimNvml``).

Throttle time: each simulated GPU is held back by each cause for a configurable share of the time
(``throttle={NVML_PERF_POLICY_*: share}``), so ``nvmlDeviceGetViolationStatus`` reports nanoseconds
that advance at ``share`` seconds per simulated second, exactly, on the simulator's clock.

Per-call cost: ``call_cost={"nvmlDeviceGetPcieThroughput": 0.02}`` makes each such call block for
that long, as the real driver does while it samples the link; the bench and the tests of the slow-call
path use it. ``call_threads`` records which threads made each such call (a cost of 0 records them too).

``timer`` is a clock of those costs: the seconds of cost the calling thread has paid so far. A backend
given it (``NvmlBackend(slow_call_timer=sim.timer)``) measures a call at exactly its cost, so which calls
are slow is the scenario's choice even on a loaded machine, where a real clock can see a 0.1 ms call
take 30 ms. It is per thread: a call measured on the reading thread is not charged for the calls that
workers run meanwhile, as in real time. The calls still block for their cost (releasing the GIL), so
threads overlap as they do over the driver.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

import pynvml

__all__ = ["DEFAULT_THROTTLE", "ThrottleSim"]

# a little power capping and thermal slowdown, so a demo page shows non-zero counters
DEFAULT_THROTTLE: Mapping[int, float] = {pynvml.NVML_PERF_POLICY_POWER: 0.05, pynvml.NVML_PERF_POLICY_THERMAL: 0.01}


class ThrottleSim:
    clock: Callable[[], float]
    start: float
    gpus: int
    _lock: threading.Lock
    _enter: Callable[..., Any]

    def _init_throttle(self, throttle: Mapping[int, float] | None, call_cost: Mapping[str, float] | None) -> None:
        self.throttle: dict[int, float] = dict(DEFAULT_THROTTLE if throttle is None else throttle)
        self.call_cost: dict[str, float] = dict(call_cost or {})
        self.call_threads: dict[str, set[str]] = {}
        self._paid = threading.local()  # .seconds: the costs the thread has paid
        self._throttle_base: dict[tuple[int, int], tuple[float, float]] = {}  # (gpu, policy) -> (t, ns)

    def _pay(self, call: str) -> None:
        """Block for the call's simulated cost, noting the calling thread (calls with a cost only)."""
        cost = self.call_cost.get(call)
        if cost is not None:
            self.call_threads.setdefault(call, set()).add(threading.current_thread().name)
            if cost > 0:
                time.sleep(cost)
                self._paid.seconds = self.timer() + cost

    def timer(self) -> float:
        """Seconds of simulated call cost this thread has paid: a clock for the backend's slow calls."""
        return float(getattr(self._paid, "seconds", 0.0))

    def set_throttle(self, policy: int, share: float) -> None:
        """From now on every GPU is held back by ``policy`` for ``share`` of the time (0 stops it)."""
        now = self.clock()
        with self._lock:
            for index in range(self.gpus):
                self._throttle_base[(index, policy)] = (now, self._violation_ns(index, policy, now))
            self.throttle[policy] = share

    def _violation_ns(self, index: int, policy: int, now: float) -> float:
        since, base = self._throttle_base.get((index, policy), (self.start, 0.0))
        return base + (now - since) * self.throttle.get(policy, 0.0) * 1e9

    def nvmlDeviceGetViolationStatus(self, h: Any, policy: int) -> SimpleNamespace:
        where = self._enter("nvmlDeviceGetViolationStatus", h)
        if where.mig is not None:
            raise pynvml.NVMLError_NotSupported()
        if policy not in self.throttle:
            raise pynvml.NVMLError_NotSupported()
        now = self.clock()
        with self._lock:
            ns = self._violation_ns(where.index, policy, now)
        return SimpleNamespace(referenceTime=int(now * 1e6), violationTime=int(ns))
