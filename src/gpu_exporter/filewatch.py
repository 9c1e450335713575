"""Files a daemon re-reads when they change: the agent's configuration and web config files (reload.py),
the bridge's web config file (bridge/cli.py) and the web server's TLS certificate, key and client CA
(web/tls.py). A file is known by its modification time, size and inode (a Kubernetes Secret or
cert-manager renews by swapping a symlink: the inode changes, the size may not)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

__all__ = ["Watched", "stamp"]


def stamp(path: str) -> tuple[int, int, int]:
    """(mtime in ns, size, inode) of ``path``; zeros when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Watched:
    """Files compared with how they stood before the daemon last read them.

    Take one before the first read and call ``changed`` after: a file written meanwhile, even while the
    daemon was still starting, counts as changed. ``changed`` moves the baseline to what it saw before
    the caller reads again, so a write during that read is seen at the next look too. With ``every``,
    looks closer together than that many seconds see nothing (callers on a hot path: a new connection)."""

    def __init__(
        self, paths: Iterable[str] = (), every: float = 0.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._last = {p: stamp(p) for p in paths if p}
        self._every = every
        self._clock = clock
        self._looked = clock()

    def changed(self, paths: Iterable[str] | None = None) -> str | None:
        """The first of ``paths`` (default: those watched) that changed since the last look, or None. A path
        not seen before is taken as it stands now."""
        if self._every:
            now = self._clock()
            if now - self._looked < self._every:
                return None
            self._looked = now
        stamps = {p: stamp(p) for p in (self._last if paths is None else paths) if p}
        first = next((p for p, s in stamps.items() if p in self._last and s != self._last[p]), None)
        self._last = stamps
        return first
