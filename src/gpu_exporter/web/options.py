"""The endpoint's options (``--web.*``, exporter-toolkit's names): where the agent serves, and the TLS,
auth and limits (``webconfig.py``, ``server.py``) that the bridge's endpoint takes too."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.config.parsers import (
    Option,
    int_between,
    parse_bool,
    parse_listen,
    parse_path,
    seconds_between,
)

__all__ = ["ENDPOINT_OPTIONS", "SERVING_OPTIONS", "WEB_OPTIONS", "WebOptions"]


@dataclass(frozen=True)
class WebOptions:
    listen_address: tuple[str, ...] = (":9400",)  # every one served at once
    web_systemd_socket: bool = False  # serve on the sockets systemd passes (web/activation.py) instead
    telemetry_path: str = "/metrics"
    web_disable_exporter_metrics: bool = False  # no process_* or gpu_exporter_http_* on the page
    web_config_file: str = ""  # TLS, basic auth, headers (exporter-toolkit format); empty: plain HTTP
    web_max_connections: int = 64
    web_read_timeout: float = 10.0
    web_idle_timeout: float = 120.0


# The agent's address and path; the bridge has its own (--bridge.listen-address).
SERVING_OPTIONS: tuple[Option, ...] = (
    Option(
        "web.listen-address",
        "listen_address",
        parse_listen,
        "address for /metrics, /healthz, /readyz; give it once per address to serve on several at once "
        "(IPv4 and IPv6, a node IP and loopback); in the environment or a YAML string comma-separated",
        "[HOST]:PORT",
        repeated=True,
    ),
    Option(
        "web.systemd-socket",
        "web_systemd_socket",
        parse_bool,
        "serve on the listening sockets systemd passes (socket activation: LISTEN_FDS, LISTEN_PID) instead "
        "of binding --web.listen-address",
        "BOOL",
    ),
    Option("web.telemetry-path", "telemetry_path", parse_path, "path under which metrics are served", "PATH"),
    Option(
        "web.disable-exporter-metrics",
        "web_disable_exporter_metrics",
        parse_bool,
        "leave the exporter process's own metrics out of the page: process_* and the endpoint's "
        "gpu_exporter_http_*, as node_exporter leaves out process_*, go_* and promhttp_*; the collect, ring, "
        "forward and build_info series stay",
        "BOOL",
    ),
)

# TLS, basic auth, headers and limits: the agent's endpoint and the bridge's.
ENDPOINT_OPTIONS: tuple[Option, ...] = (
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
)

WEB_OPTIONS = SERVING_OPTIONS + ENDPOINT_OPTIONS
