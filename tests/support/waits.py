"""Waiting for what a test checks: bounded polls on a condition, never a fixed sleep (docs/testing.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float, what: str | None = None, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that.

    An ``OSError`` from it (an endpoint not listening yet, a file not written yet) counts as "not yet".
    When ``timeout`` passes without success: with ``what`` (what is awaited, in words) it raises
    ``TimeoutError`` naming it; without, it returns the last value, falsy, for the caller to assert on
    with its own message (or raises the ``OSError`` of a last attempt that failed so)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value, error = predicate(), None
        except OSError as exc:
            value, error = None, exc
        if value:
            return value
        if time.monotonic() >= deadline:
            if what is not None:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}") from error
            if error is not None:
                raise error
            return value
        time.sleep(interval)


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, step: float = 0.05) -> bool:
    """``wait_until`` as a bool, with a default bound."""
    return bool(wait_until(predicate, timeout, interval=step))


def wait_progressing(
    done: Callable[[], Any], progress: Callable[[], Any], stall: float, what: str, interval: float = 0.5
) -> Any:
    """Poll ``done`` until it returns something truthy (then return it), for as long as the work moves.

    For work whose amount is fixed but whose speed is the machine's (a flood the bridge must decode):
    on a loaded machine it takes longer, so there is no deadline; it fails when ``progress()`` (a
    reading of the work, such as messages received and samples written) has not changed for ``stall``
    seconds, which is a hang, not load. The test's own timeout stays the last guard."""

    def reading(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except OSError:  # an endpoint too busy to answer in time: not done, no progress seen
            return None

    last = reading(progress)
    moved = time.monotonic()
    while True:
        value = reading(done)
        if value:
            return value
        now = reading(progress)
        if now is not None and now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(f"no progress for {stall:g}s waiting for {what} (still at {last!r})")
        time.sleep(interval)
