"""The agent's own options: which GPUs, how often, where it serves, what it logs, simulation, paths."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.backends import registry
from gpu_exporter.config.parsers import (
    Option,
    choice,
    duration_at_least,
    int_between,
    parse_interval,
    parse_listen,
    parse_nonneg_int,
    parse_path,
    parse_regex,
    seconds_between,
)

__all__ = ["AGENT_OPTIONS", "SHARED_WITH_BRIDGE", "VENDORS", "AgentOptions"]

VENDORS = ("auto", *registry.vendors())


@dataclass(frozen=True)
class AgentOptions:
    gpu_vendor: str = "auto"
    interval: float = 5.0
    buffer_size: int = 256
    listen_address: str = ":9400"
    telemetry_path: str = "/metrics"
    web_config_file: str = ""  # TLS, basic auth, headers (exporter-toolkit format); empty: plain HTTP
    web_max_connections: int = 64
    web_read_timeout: float = 10.0
    web_idle_timeout: float = 120.0
    node_name: str = ""
    config_file: str = ""
    log_level: str = "info"
    log_format: str = "logfmt"
    metrics_include: str = ""
    metrics_exclude: str = ""
    disabled_collectors: frozenset[str] = frozenset()
    fake_gpus: int = 2
    fake_mig: int = 0
    fake_seed: int = 0
    fake_pcie_call_seconds: float = 0.0  # simulated time each PCIe throughput call blocks
    path_sysfs: str = "/sys"
    path_procfs: str = "/proc"

    def collector_enabled(self, group: str) -> bool:
        return group not in self.disabled_collectors


AGENT_OPTIONS: tuple[Option, ...] = (
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
    Option(
        "web.listen-address",
        "listen_address",
        parse_listen,
        "address for /metrics, /healthz, /readyz",
        "[HOST]:PORT",
    ),
    Option("web.telemetry-path", "telemetry_path", parse_path, "path under which metrics are served", "PATH"),
    Option(
        "web.config.file",
        "web_config_file",
        str,
        "web config YAML in the Prometheus exporter-toolkit format: TLS (tls_server_config), basic auth "
        "(basic_auth_users, bcrypt), response headers; /healthz and /readyz stay open",
        "FILE",
    ),
    Option(
        "web.max-connections",
        "web_max_connections",
        int_between(2, 10000),
        "open HTTP connections served at once; past it the connection waiting longest for its request is "
        "closed, or a 503 when all are busy (counted in gpu_exporter_http_connections_dropped_total)",
        "N",
    ),
    Option(
        "web.read-timeout",
        "web_read_timeout",
        seconds_between(0.1, 600),
        "a request (and TLS handshake) must arrive in full within this time of the connection",
        "DURATION",
    ),
    Option(
        "web.idle-timeout",
        "web_idle_timeout",
        seconds_between(1, 3600),
        "a keep-alive connection is closed after this long without a request",
        "DURATION",
    ),
    Option("node-name", "node_name", str, "node name (default: $NODE_NAME, else the hostname)", "NAME"),
    Option("log.level", "log_level", choice("debug", "info", "warn", "error"), "log level", "LEVEL"),
    Option(
        "log.format",
        "log_format",
        choice("logfmt", "json", "text"),
        "log format: logfmt (ts=... level=... caller=... msg=...) or json; text is logfmt too",
        "FORMAT",
    ),
    Option(
        "metrics.include",
        "metrics_include",
        parse_regex,
        "only serve and forward metrics whose name matches this regex",
        "REGEX",
    ),
    Option("metrics.exclude", "metrics_exclude", parse_regex, "drop metrics whose name matches this regex", "REGEX"),
    Option("fake.gpus", "fake_gpus", int_between(1, 64), "simulated GPUs for --gpu-vendor=fake", "N"),
    Option(
        "fake.mig",
        "fake_mig",
        parse_nonneg_int,
        "MIG instances on the first simulated GPU (0 disables MIG; at most 7)",
        "N",
    ),
    Option("fake.seed", "fake_seed", int_between(0, 2**32 - 1), "seed for the simulated values", "N"),
    Option(
        "fake.pcie-call-duration",
        "fake_pcie_call_seconds",
        duration_at_least(0.0),
        "time each simulated PCIe throughput call blocks, as a real driver samples the link (e.g. 20ms)",
        "DURATION",
    ),
    Option("path.sysfs", "path_sysfs", parse_path, "sysfs mount point", "PATH"),
    Option("path.procfs", "path_procfs", parse_path, "procfs mount point", "PATH"),
)

# The bridge's endpoint (TLS, auth, limits: web/server.py) and its logs take these too.
SHARED_WITH_BRIDGE = (
    "web.config.file",
    "web.max-connections",
    "web.read-timeout",
    "web.idle-timeout",
    "log.level",
    "log.format",
)
