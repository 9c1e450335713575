"""The polling thread: reads every backend on a fixed, drift-free schedule into the ring buffer.

The schedule is kept on the monotonic clock (tick k is at start + k * interval), so a slow cycle does
not shift later ones; ticks that a cycle overran entirely are skipped and counted rather than bunched.
The sampler is the only caller of vendor libraries.

A sampler that is stuck (a vendor call that never returns) or failing (every backend raises) is *stale*
once no backend has read for ``STALE_INTERVALS`` intervals (``STALE_MIN`` seconds at least): /readyz
answers 503 and the page serves no GPU series, only the agent's own (``gpu_exporter_sampler_stale 1``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gpu_exporter.backends.base import Backend
from gpu_exporter.limits import SampleBounds
from gpu_exporter.model import DeviceSample, Sample
from gpu_exporter.ring import RingBuffer

__all__ = ["Sampler"]

log = logging.getLogger(__name__)

Listener = Callable[[Sample], None]

STALE_INTERVALS = 3  # intervals without a backend reading before the sampler is stale ...
STALE_MIN = 10.0  # ... and at least this many seconds: a busy node's slow cycle is not a stuck sampler


class Sampler:
    def __init__(
        self,
        backends: Sequence[Backend],
        ring: RingBuffer,
        interval: float,
        listeners: Sequence[Listener] = (),
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.backends = list(backends)
        self.ring = ring
        self.interval = interval
        self.listeners = list(listeners)
        self._monotonic = monotonic
        self._wall = wall
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait  # returns True once stopping
        self._thread: threading.Thread | None = None
        self._seq = 0
        # read by the self-metrics collector; plain attributes, written by one thread
        self.collects = 0
        self.collect_seconds_total = 0.0
        self.last_duration = 0.0
        self.last_success = 0.0
        self.overruns = 0
        self.failures = 0  # backend.read() raised (a bug): counted, the loop goes on
        self.bounds = SampleBounds()  # labels and values bounded before anything serves or sends them
        # monotonic: when the newest cycle in which at least one backend read ended (first: when it started)
        self._fresh: float | None = None
        self._said_stale = False  # logged once when seen stale, once when reading again

    def collect_once(self) -> Sample:
        started = self._monotonic()
        timestamp = self._wall()
        devices: list[DeviceSample] = []
        ok = True
        fresh = not self.backends
        if self._fresh is None:
            self._fresh = started
        for backend in self.backends:
            try:
                devices.extend(backend.read())
                fresh = True
            except Exception:
                ok = False
                self.failures += 1
                log.exception("reading the %s backend failed; its devices are missing from this sample", backend.name)
        duration = self._monotonic() - started
        self._seq += 1
        sample = self.bounds.apply(Sample(self._seq, timestamp, tuple(devices), duration))
        self.ring.append(sample)
        self.collects += 1
        self.collect_seconds_total += duration
        self.last_duration = duration
        if ok:
            self.last_success = timestamp
        if fresh:
            self._fresh = self._monotonic()
            if self._said_stale:
                self._said_stale = False
                log.info("the backends read again: the sampler is no longer stale")
        for listener in self.listeners:
            try:
                listener(sample)
            except Exception:
                log.exception("a sample listener failed")
        return sample

    def age(self) -> float | None:
        """Seconds since a backend last read (since the first cycle began, before one has); None before."""
        fresh = self._fresh
        return None if fresh is None else max(0.0, self._monotonic() - fresh)

    def stale_after(self) -> float:
        return max(STALE_INTERVALS * self.interval, STALE_MIN)

    def stale(self) -> bool:
        """Stuck or failing: no backend has read for ``stale_after()`` seconds."""
        age = self.age()
        stale = age is not None and age > self.stale_after()
        if stale and not self._said_stale:
            self._said_stale = True
            log.warning(
                "no backend has read for %.0fs (a call that does not return, or every read failing): "
                "/readyz answers 503 and the page holds no GPU series until one reads",
                age,
            )
        return stale

    def run(self) -> None:
        next_tick = self._monotonic()
        while not self._stop.is_set():
            self.collect_once()
            next_tick += self.interval
            now = self._monotonic()
            if now > next_tick:
                missed = int((now - next_tick) // self.interval) + 1
                self.overruns += missed
                next_tick += missed * self.interval
                log.debug("collect overran the interval; skipped %d tick(s)", missed)
            if self._wait(max(0.0, next_tick - now)):
                break

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
