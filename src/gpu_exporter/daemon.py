"""What both daemons share (the agent, ``cli.py``; the bridge, ``bridge/cli.py``): the signal wiring, and
one malloc arena (``limit_malloc_arenas``).

SIGTERM and SIGINT stop the daemon; SIGHUP asks it to reload, which each daemon defines: the agent
re-reads its whole configuration (``reload.py``), the bridge its web config file.

A handler only notes the signal in a plain attribute and writes a byte to a pipe the main thread waits
on; the main thread does the rest (logs, sets ``stop``, reloads) between its waits. Python runs a handler
in the main thread between two bytecodes, also inside another handler or inside whatever lock the main
thread holds, so a handler that takes a lock (``Event.set()``, a log line) deadlocks when a signal comes
at the wrong moment: a thousand SIGHUPs at once did it every time, and SIGTERM then never ended the
process.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["Signals", "limit_malloc_arenas"]

TICK = 0.5  # seconds between looks at ``stop`` (set by another thread) and at ``poll``
_STOPPING = (signal.SIGTERM, signal.SIGINT)


class Signals:
    """``stop`` set after SIGTERM/SIGINT (once ``on_stop(signum)`` has run, in the main loop); SIGHUP
    reloads through ``run``'s ``on_hup``."""

    def __init__(self, stop: threading.Event, on_stop: Callable[[int], None] | None = None) -> None:
        self.stop = stop
        self._on_stop = on_stop
        # written by the handler only as plain assignments: no lock is ever taken in it
        self._stop_signum = 0
        self._hup = False
        # the wakeup pipe, made by install(); never closed, since the handlers outlive run() (a signal
        # during shutdown must not write into whatever file reuses the descriptor)
        self._wake: tuple[int, int] | None = None

    def install(self) -> None:
        """Take the three signals; only from the main thread (a daemon run by a test in a thread keeps the
        process's handlers, and is stopped through ``stop``)."""
        if threading.current_thread() is not threading.main_thread():
            return
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._wake = read, write
        for signum in (*_STOPPING, signal.SIGHUP):
            signal.signal(signum, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._hup = True
        else:
            self._stop_signum = signum
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"\0")
            except OSError:  # the pipe is full: the main loop has a wakeup pending already
                pass

    def _wait(self, timeout: float) -> None:
        """Until a signal's wakeup byte (read, all of them: many signals, one look) or ``timeout``."""
        if self._wake is None:  # not installed: only ``stop`` ends the wait early
            self.stop.wait(timeout)
            return
        readable, _, _ = select.select([self._wake[0]], [], [], timeout)
        if readable:
            try:
                while os.read(self._wake[0], 4096):
                    pass
            except BlockingIOError:
                pass

    def run(self, on_hup: Callable[[], None], poll: Callable[[], bool] | None = None) -> None:
        """Until a stop signal or ``stop``: ``on_hup()`` once for the SIGHUPs that came since the last one
        (many at once are one reload), and each time ``poll()`` (called every tick) says that something
        the daemon watches changed."""
        while not self._stop_signum and not self.stop.is_set():
            self._wait(TICK)
            if self._stop_signum:
                break
            if poll is not None and poll():
                self._hup = True
            if self._hup:
                self._hup = False
                on_hup()
        if self._stop_signum:
            if self._on_stop is not None:
                self._on_stop(self._stop_signum)
            self.stop.set()


_M_ARENA_MAX = -8  # mallopt parameter, from glibc's <malloc.h>


def limit_malloc_arenas(arenas: int = 1) -> bool:
    """Have glibc's malloc keep ``arenas`` arenas instead of up to eight per core; True when it took.

    Each thread that allocates while another holds the main arena gets an arena of its own (sampler, HTTP
    server, forwarder, pod attribution), which keeps the memory freed in it; since nearly every allocation
    here happens under the GIL, the extra arenas buy no concurrency. With one arena the exporter with
    forwarding measured 1.8 MiB less RSS (bench/bench_forward.py). Called before any thread starts. A
    MALLOC_ARENA_MAX in the environment is left to rule, and where malloc is not glibc's nothing happens.
    """
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, arenas))
