"""The agent's own options: which GPUs it reads, how often, what the ring keeps (``sampler.py``,
``ring.py``); the node's name, its logs (``logs.py``) and which metrics it serves and forwards
(``exposition.py``). The endpoint's options are in ``web/options.py``, simulation and OS paths in
``backends/options.py``; ``config/commands.py`` says which command reads which."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.backends.options import VENDORS
from gpu_exporter.config.parsers import Option, choice, int_between, parse_bool, parse_interval, parse_regex

__all__ = ["AGENT_OPTIONS", "DISABLE_DEFAULTS", "LOG_OPTIONS", "SAMPLING_OPTIONS", "AgentOptions", "SamplingOptions"]


@dataclass(frozen=True)
class SamplingOptions:
    gpu_vendor: str = "auto"
    interval: float = 5.0
    buffer_size: int = 256


@dataclass(frozen=True)
class AgentOptions:
    node_name: str = ""
    config_file: str = ""
    log_level: str = "info"
    log_format: str = "logfmt"
    metrics_include: str = ""
    metrics_exclude: str = ""
    disabled_collectors: frozenset[str] = frozenset()  # --no-collector.X
    enabled_collectors: frozenset[str] = frozenset()  # --collector.X, named
    collector_disable_defaults: bool = False  # only the collectors named in enabled_collectors run

    def collector_enabled(self, group: str) -> bool:
        """Every collector group is on by default; ``--no-collector.X`` turns one off, and with
        ``--collector.disable-defaults`` only those switched on by name (``--collector.X``) run, as in
        node_exporter."""
        if group in self.disabled_collectors:
            return False
        return not self.collector_disable_defaults or group in self.enabled_collectors


SAMPLING_OPTIONS: tuple[Option, ...] = (
    Option(
        "gpu-vendor",
        "gpu_vendor",
        choice(*VENDORS),
        "GPU library to read: auto picks what the machine has; fake simulates GPUs",
        "VENDOR",
    ),
    Option(
        "gpu-metrics-collection-interval",
        "interval",
        parse_interval,
        "how often GPUs are read, e.g. 500ms, 5s, 1m",
        "DURATION",
    ),
    Option(
        "metrics-buffer-size",
        "buffer_size",
        int_between(1, 1_000_000),
        "samples kept in the ring buffer (the oldest is overwritten); it only needs to cover a pause of the "
        "forwarder or of pod attribution, 21 min at the default interval",
        "N",
    ),
)

# The bridge logs as the agent does, and takes these too.
LOG_OPTIONS: tuple[Option, ...] = (
    Option("log.level", "log_level", choice("debug", "info", "warn", "error"), "log level", "LEVEL"),
    Option(
        "log.format",
        "log_format",
        choice("logfmt", "json", "text"),
        "log format: logfmt (ts=... level=... caller=... msg=...) or json; text is logfmt too",
        "FORMAT",
    ),
)

AGENT_OPTIONS: tuple[Option, ...] = (
    Option("node-name", "node_name", str, "node name (default: $NODE_NAME, else the hostname)", "NAME"),
    *LOG_OPTIONS,
    Option(
        "metrics.include",
        "metrics_include",
        parse_regex,
        "only serve and forward metrics whose name matches this regex",
        "REGEX",
    ),
    Option("metrics.exclude", "metrics_exclude", parse_regex, "drop metrics whose name matches this regex", "REGEX"),
)

# node_exporter's --collector.disable-defaults; listed with the collector switches (config/sources.py),
# which fill enabled_collectors and disabled_collectors
DISABLE_DEFAULTS = Option(
    "collector.disable-defaults",
    "collector_disable_defaults",
    parse_bool,
    "turn every collector off but those switched on by name (--collector.disable-defaults --collector.power)",
    "BOOL",
)
