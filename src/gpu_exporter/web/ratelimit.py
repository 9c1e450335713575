"""``rate_limit`` of the web config file: a token bucket in front of every path but the probes.

As the exporter toolkit does (Go's ``rate.NewLimiter(rate.Every(interval), burst)``): the bucket holds
``burst`` tokens and starts full, one token comes back every ``interval``, each request takes one, and a
request that finds none is answered 429 at once. ``interval: 0`` (or no ``rate_limit``) turns it off;
``burst: 0`` with an interval refuses every request, as in the toolkit. One bucket for all clients, not
one per address: it bounds what the endpoint does, whoever asks. /healthz and /readyz are not counted:
the kubelet's probes must not fail because someone else used the budget.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

__all__ = ["RateLimiter", "parse_go_duration"]


class RateLimiter:
    def __init__(self, interval: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if interval <= 0 or burst < 0:
            raise ValueError("a rate limit needs a positive interval and a burst of 0 or more")
        self.interval = interval
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()
        self.refused = 0

    def allow(self) -> bool:
        """Take a token; False (and counted) when there is none."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._at) / self.interval)
            self._at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            self.refused += 1
            return False


_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(value: object) -> float:
    """Seconds in a Go duration as the toolkit's YAML takes it: ``"1m30s"``, ``"500ms"``, ``"0"``, or an
    integer (nanoseconds, as a ``time.Duration``); ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int):
        return value * 1e-9
    text = str(value).strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(body):
        match = _GO_PART.match(body, pos)
        if match is None:
            raise ValueError(f"invalid duration {text!r} (use e.g. 100ms, 1s, 1m30s)")
        total += float(match.group(1)) * _GO_UNITS[match.group(2)]
        pos = match.end()
    if not body:
        raise ValueError(f"invalid duration {text!r} (use e.g. 100ms, 1s, 1m30s)")
    return sign * total
