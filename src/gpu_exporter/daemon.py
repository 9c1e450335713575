"""The signal wiring both daemons share (the agent, ``cli.py``; the bridge, ``bridge/cli.py``).

SIGTERM and SIGINT stop the daemon; SIGHUP asks it to reload, which each daemon defines: the agent
re-reads its whole configuration (``reload.py``), the bridge its web config file. Handlers only set
events; the daemon's main thread acts on them between waits of half a second, so a signal never runs
code in the middle of whatever the main thread was doing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["Signals"]

TICK = 0.5  # seconds between looks at the events


class Signals:
    """``stop`` set by SIGTERM/SIGINT (after ``on_stop(signum)``), ``hup`` by SIGHUP."""

    def __init__(self, stop: threading.Event, on_stop: Callable[[int], None] | None = None) -> None:
        self.stop = stop
        self.hup = threading.Event()
        self._on_stop = on_stop

    def install(self) -> None:
        """Take the three signals; only from the main thread (a daemon run by a test in a thread keeps the
        process's handlers, and is stopped through ``stop``)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._stop_signal)
            signal.signal(signal.SIGINT, self._stop_signal)
            signal.signal(signal.SIGHUP, self._hup_signal)

    def _stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._on_stop is not None:
            self._on_stop(signum)
        self.stop.set()

    def _hup_signal(self, signum: int, frame: FrameType | None) -> None:
        self.hup.set()

    def run(self, on_hup: Callable[[], None], poll: Callable[[], bool] | None = None) -> None:
        """Until ``stop``: ``on_hup()`` once for each SIGHUP, and for each time ``poll()`` (called every
        tick) says that something the daemon watches changed."""
        while not self.stop.wait(TICK):
            if poll is not None and poll():
                self.hup.set()
            if self.hup.is_set():
                self.hup.clear()
                on_hup()
