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
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpu_exporter import config as cfg
from gpu_exporter.filewatch import Watched
from gpu_exporter.mqtt.settings import LINK_LIVE

__all__ = ["LIVE", "Reloader"]

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

_FLAGS = {o.field: o.name for o in cfg.ALL_OPTIONS if not o.is_switch} | {
    "disabled_collectors": "collector.<group>",
    "enabled_collectors": "collector.<group>",
}


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
    def watch(self, watched: Watched, interval: float = 2.0) -> None:
        """Re-read the configuration each time one of its files changes, from ``watched`` (the files as they
        stood before the daemon read them: a change made while it started is seen too)."""
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
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value)
