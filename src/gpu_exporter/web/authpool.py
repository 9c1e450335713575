"""Password checks on a small bounded pool, so that wrong passwords cannot take every connection.

A bcrypt check costs a fixed amount of CPU (about 0.25 s at cost 12). Checked on each connection's own
thread, a flood of wrong passwords kept every connection slot busy checking, and the scrapes that came
with the right password found none free. Here the checks run on ``workers`` threads (one by default: a
second would only take the core the scrapes need) fed by a queue of at most ``depth`` checks:

- A check waits in the queue, and its connection counts as waiting: the server may close it to make room
  for a newcomer (``WebServer.process_request``), which cancels the check.
- The queue is ordered by rank (``AuthState.ticket``): pairs sent again while their first check was
  refused or never ran (a scraper retrying after a 429) come first, by the time they were first seen;
  then pairs seen for the first time (a brute force sends nothing else), oldest first, those from a
  connection whose last request was refused (a flood's keep-alive connection) after all others. A full
  queue makes room for a check that ranks higher by refusing its lowest one (answered 429 at once), and
  refuses one that ranks no higher than all it holds. So a scraper's first check waits for at most the
  check running and the better-ranked ones queued before it, however many fresh wrong passwords arrive
  on the flood's connections meanwhile; its retry, if it still came too late, goes ahead of them all.
- What the check found is remembered by the caller (``auth.py``): a right pair costs a dictionary lookup
  from then on, and so does a wrong pair seen recently. Only pairs never seen cost bcrypt.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from itertools import count

__all__ = ["CheckPool", "Job"]

_BUSY = "busy"
_CANCELLED = "cancelled"


class Job:
    """One password check: its place in the queue, and its outcome once known."""

    __slots__ = ("_done", "check", "order", "outcome", "started")
    _lock = threading.Lock()  # one for all jobs: finishing is rare and quick

    def __init__(self, ticket: tuple[int, float], serial: int, check: Callable[[], bool]) -> None:
        self.order = (*ticket, serial)  # retried pairs first, then older tickets, then the first queued
        self.check = check
        self.outcome: bool | str | None = None  # True, False, "busy" (pushed out), "cancelled"
        self.started = False
        self._done = threading.Event()

    def finish(self, outcome: bool | str) -> None:
        """The first outcome stands (a check that ends as its waiter gives up is not both)."""
        with Job._lock:
            if self.outcome is not None:
                return
            self.outcome = outcome
        self._done.set()

    def wait(self, timeout: float) -> bool | str:
        """True or False (the check's answer), ``"busy"`` or ``"cancelled"``; ``"busy"`` after ``timeout``."""
        if not self._done.wait(timeout):
            self.finish(_BUSY)
        assert self.outcome is not None
        return self.outcome

    def cancel(self) -> None:
        """The connection went away: the check is not worth running any more."""
        self.finish(_CANCELLED)

    @property
    def pending(self) -> bool:
        """Queued and not started: cancelling it saves a whole check."""
        return self.outcome is None and not self.started


class CheckPool:
    def __init__(self, workers: int = 1, depth: int = 4) -> None:
        if workers < 1 or depth < 1:
            raise ValueError("a check pool needs at least one worker and one queue place")
        self.workers = workers
        self.depth = depth
        self._queue: list[Job] = []  # sorted by Job.order
        self._cv = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._serial = count()
        self._stopped = False
        # read by the server's collector
        self.checks = 0  # bcrypt checks run
        self.refused = 0  # checks refused or pushed out for a full queue (answered 429)
        self.cancelled = 0  # checks whose connection went away before they ran

    def submit(self, ticket: tuple[int, float], check: Callable[[], bool]) -> Job | None:
        """Queue ``check``; None when the queue is full of checks with older tickets."""
        job = Job(ticket, next(self._serial), check)
        with self._cv:
            self._prune()
            if len(self._queue) >= self.depth:
                youngest = self._queue[-1]
                if youngest.order < job.order:
                    self.refused += 1
                    return None
                self._queue.pop()
                youngest.finish(_BUSY)
                self.refused += 1
            bisect.insort(self._queue, job, key=lambda j: j.order)
            self._start()
            self._cv.notify()
        return job

    def queued(self) -> int:
        with self._cv:
            self._prune()
            return len(self._queue)

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            for job in self._queue:
                job.finish(_CANCELLED)
            self._queue.clear()
            self._cv.notify_all()

    def _prune(self) -> None:
        """Forget checks that were cancelled or gave up waiting (under the lock)."""
        if any(job.outcome is not None for job in self._queue):
            gone = [job for job in self._queue if job.outcome is not None]
            self.cancelled += sum(1 for job in gone if job.outcome == _CANCELLED)
            self._queue = [job for job in self._queue if job.outcome is None]

    def _start(self) -> None:
        while len(self._threads) < self.workers:
            thread = threading.Thread(target=self._work, name=f"auth-check-{len(self._threads)}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._stopped:
                    self._prune()
                    if self._queue:
                        break
                    self._cv.wait()
                if self._stopped:
                    return
                job = self._queue.pop(0)
                job.started = True
                self.checks += 1
            try:
                outcome = job.check()
            except Exception:  # a check that cannot run answers no
                outcome = False
            job.finish(outcome)
