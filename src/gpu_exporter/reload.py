"""Reload without restart: on SIGHUP, and when ``--config.file`` or ``--web.config.file`` changes (checked
every 2 s), the configuration is read again.

Options in ``LIVE`` take their new value at once, through the appliers the agent registers (the ring,
the open batch and the spool stay as they are). Any other option that changed is named in one log line
and keeps its running value until a restart. A configuration that does not load (a typo in the file)
is one error line; the running configuration stays.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpu_exporter import config as cfg
from gpu_exporter.mqtt.settings import LINK_LIVE

__all__ = ["LIVE", "Reloader", "Watched", "stamp"]

log = logging.getLogger("gpu_exporter.reload")

# Config fields that change while running: these, and the link's (mqtt/settings.py says which).
LIVE = frozenset(
    {
        "log_level",
        "log_format",
        "interval",
        "metrics_include",
        "metrics_exclude",
        "web_config_file",
        "web_max_connections",
        "web_read_timeout",
        "web_idle_timeout",
        "mqtt_batch_interval",
        "mqtt_batch_max_bytes",
        "mqtt_batch_max_samples",
        "mqtt_value_digits",
        "spool_replay_rate",
        *LINK_LIVE,
    }
)

Applier = Callable[[cfg.Config, cfg.Config], None]  # (old, new)

_FLAGS = {o.field: o.name for o in cfg.OPTIONS} | {"disabled_collectors": "collector.<group>"}


class Reloader:
    """Holds the running Config; ``reload`` re-reads it and applies what may change."""

    def __init__(
        self,
        args: Mapping[str, Any],
        current: cfg.Config,
        appliers: list[Applier],
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.args = dict(args)
        self.current = current
        self.appliers = appliers
        self.environ = environ
        self.reloads = 0
        self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def reload(self, why: str) -> bool:
        """Re-read and apply; False (one error line, nothing changed) when the configuration is bad."""
        with self._lock:
            old = self.current
            try:
                new = cfg.load(self.args, self.environ)
            except cfg.ConfigError as exc:
                self.failures += 1
                log.error("reload (%s) failed, keeping the running configuration: %s", why, exc)
                return False
            keep = {}
            for f in dataclasses.fields(cfg.Config):
                before, after = getattr(old, f.name), getattr(new, f.name)
                if before != after and f.name not in LIVE:
                    name = _FLAGS.get(f.name, f.name.replace("_", "-"))
                    log.warning("reload: --%s changed; it needs a restart, keeping %s", name, _shown(before))
                    keep[f.name] = before
            new = dataclasses.replace(new, **keep)
            changed = sorted(
                f.name for f in dataclasses.fields(cfg.Config) if getattr(old, f.name) != getattr(new, f.name)
            )
            for apply in self.appliers:
                try:
                    apply(old, new)
                except (ValueError, OSError) as exc:
                    self.failures += 1
                    log.error("reload (%s): %s; keeping the running value", why, exc)
                    return False
            self.current = new
            self.reloads += 1
            shown = ", ".join(_FLAGS.get(name, name) for name in changed) or "nothing changed"
            log.info("reloaded the configuration (%s): %s", why, shown)
            return True

    # --- watching --config.file and --web.config.file ---
    def watch(self, since: Watched | None = None, interval: float = 2.0) -> None:
        """Re-read the configuration each time one of its files changes, as from ``since`` (the files as
        they stood before the daemon read them: a change made while it started is seen too)."""
        watched = since if since is not None else Watched(self._paths())
        self._thread = threading.Thread(target=self._watch, args=(watched, interval), name="config-watch", daemon=True)
        self._thread.start()

    def _paths(self) -> tuple[str, ...]:
        c = self.current
        return tuple(p for p in (c.config_file, c.web_config_file) if p)

    def _watch(self, watched: Watched, interval: float) -> None:
        while not self._stop.wait(interval):
            path = watched.changed(self._paths())
            if path:
                self.reload(f"{path} changed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


def _shown(value: Any) -> str:
    if isinstance(value, frozenset):
        return ",".join(sorted(value)) or "(none)"
    return repr(value)


def stamp(path: str) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0, 0)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class Watched:
    """Files a daemon re-reads when they change, compared with how they stood before it last read them.

    Take one before the first read (``Watched(paths)``) and ``changed`` after: a file written meanwhile,
    even while the daemon was still starting, counts as changed. ``changed`` moves the baseline to what it
    saw before the caller reads again, so a write during that read is seen at the next look too."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self._last = {p: stamp(p) for p in paths if p}

    def add(self, path: str) -> None:
        """One more file, as it stands now (before its first read)."""
        if path and path not in self._last:
            self._last[path] = stamp(path)

    def changed(self, paths: Iterable[str] | None = None) -> str | None:
        """The first of ``paths`` (default: those watched) that changed since the last look, or None. A path
        not seen before is taken as it stands now."""
        now = {p: stamp(p) for p in (self._last if paths is None else paths) if p}
        first = next((p for p, s in now.items() if p in self._last and s != self._last[p]), None)
        self._last = now
        return first
