"""One typed configuration, from four sources: flag > env ``GPU_EXPORTER_*`` > YAML file > default.

Every option is declared once in ``OPTIONS``; the CLI flags, the environment variable names and the
YAML keys are all derived from it, so they cannot drift apart. YAML keys are the flag names without the
leading dashes (``web.listen-address: ":9400"``), flat or nested (``web: {listen-address: ...}``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import ssl

from gpu_exporter import catalog
from gpu_exporter.backends import registry
from gpu_exporter.units import format_duration, parse_duration, parse_size

__all__ = ["OPTIONS", "Config", "ConfigError", "Option", "env_name", "load"]

ENV_PREFIX = "GPU_EXPORTER_"
VENDORS = ("auto", *registry.vendors())


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message is one line."""


@dataclass(frozen=True)
class Config:
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
    # --- forwarding options (store-and-forward) go below this line ---
    mqtt_url: str = ""  # empty: forwarding off
    mqtt_protocol: str = "5"
    mqtt_topic_prefix: str = "gpu-exporter"
    mqtt_client_id: str = ""  # empty: gpu-exporter-<node>
    mqtt_username: str = ""
    mqtt_password_file: str = ""
    mqtt_tls_ca_file: str = ""
    mqtt_tls_cert_file: str = ""
    mqtt_tls_key_file: str = ""
    mqtt_keepalive: float = 30.0
    mqtt_reconnect_max_delay: float = 30.0
    mqtt_batch_interval: float = 120.0
    mqtt_batch_max_bytes: int = 256 * 1024
    mqtt_batch_max_samples: int = 720
    mqtt_value_digits: int = 4
    mqtt_max_rate: int = 0  # bytes per second; 0: no cap
    spool_dir: str = "/var/lib/gpu-exporter/spool"
    spool_max_bytes: int = 256 * 1024 * 1024
    spool_max_age: float = 72 * 3600.0
    spool_replay_rate: float = 10.0

    # --- bridge options go below this line ---
    bridge_group: str = ""  # shared-subscription group; empty: one bridge takes everything
    bridge_client_id: str = ""  # empty: gpu-exporter-bridge-<hostname>
    bridge_session_expiry: float = 86400.0
    bridge_listen_address: str = ":9401"
    bridge_max_inflight: int = 200
    bridge_write_linger: float = 0.5
    bridge_max_payload: int = 4 * 1024 * 1024
    bridge_max_inflight_bytes: int = 64 * 1024 * 1024
    bridge_max_packet_size: int = 0  # 0: --bridge.max-payload plus 64KiB
    bridge_max_series: int = 300_000
    bridge_new_nodes_per_minute: int = 10
    bridge_node_label: str = "node"
    bridge_series_cache: int = 750_000
    bridge_max_clock_skew: float = 300.0
    bridge_clock_skew_policy: str = "correct"
    bridge_state_dir: str = ""
    bridge_max_series_per_node: int = 10_000
    remote_write_url: str = ""
    remote_write_username: str = ""
    remote_write_password_file: str = ""
    remote_write_bearer_token_file: str = ""
    remote_write_tls_ca_file: str = ""
    remote_write_tls_cert_file: str = ""
    remote_write_tls_key_file: str = ""
    remote_write_tls_insecure_skip_verify: bool = False
    remote_write_timeout: float = 10.0
    remote_write_max_samples: int = 5000
    remote_write_max_backoff: float = 10.0
    remote_write_headers: str = ""  # "Name=value,Name=value", e.g. X-Scope-OrgID=fleet

    # --- kubernetes options go below this line ---
    metrics_naming: str = "native"
    k8s_pod_attribution: bool = False
    k8s_kubelet_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    k8s_pod_logs_path: str = "/var/log/pods"
    k8s_idle_power: float | None = None  # watts; None: the lowest power seen on each GPU
    k8s_refresh_interval: float = 10.0

    def collector_enabled(self, group: str) -> bool:
        return group not in self.disabled_collectors


def _bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"invalid boolean {text!r} (use true or false)")


_MAX_INT = 1_000_000_000  # a ceiling for counts without a tighter bound of their own


def _int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(str(text).strip(), 10)
        except ValueError:
            raise ValueError(f"invalid integer {text!r}") from None
        if value < low:
            raise ValueError(f"must be at least {low}, got {value}")
        if value > high:
            raise ValueError(f"{value} is out of range (at most {high})")
        return value

    return parse


_positive_int = _int_between(1, _MAX_INT)
_nonneg_int = _int_between(0, _MAX_INT)


def _interval(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < 0.1:
        raise ValueError(f"{text!r} is below the 100ms minimum")
    if seconds > 86400:
        raise ValueError(f"{text!r} is above the 1d maximum")
    return seconds


def _regex(text: str) -> str:
    try:
        re.compile(str(text))
    except re.error as exc:
        raise ValueError(f"invalid regular expression {text!r}: {exc}") from None
    return str(text)


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"invalid choice {text!r} (choose from {', '.join(choices)})")
        return value

    return parse


# --- bridge parsers ---
def _http_url(text: str) -> str:
    from urllib.parse import urlsplit

    value = str(text).strip()
    if not value:
        return ""
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"invalid URL {text!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"invalid URL {text!r} (use http://HOST[:PORT]/PATH or https://...)")
    return value


def _headers(text: str) -> str:
    value = str(text).strip()
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, _ = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", name.strip()):
            raise ValueError(f"invalid header {item!r} (use Name=value, comma-separated)")
        if name.strip().lower() in (
            "content-type",
            "content-encoding",
            "content-length",
            "host",
            "x-prometheus-remote-write-version",
        ):
            raise ValueError(f"header {name.strip()!r} is set by the bridge itself")
    return value


def _label_name(text: str) -> str:
    value = str(text)
    if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", value) or value.startswith("__"):
        raise ValueError(f"invalid label name {text!r}")
    return value


def _group(text: str) -> str:
    value = str(text)
    if any(c in value for c in "/+#\0"):
        raise ValueError(f"invalid shared-subscription group {text!r} (no /, + or #)")
    return value


def _duration_at_least(low: float, high: float = 365 * 86400.0) -> Callable[[str], float]:
    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if seconds < low:
            raise ValueError(f"{text!r} is below the {low:g}s minimum")
        if seconds > high:
            raise ValueError(f"{text!r} is above the {format_duration(high)} maximum")
        return seconds

    return parse


def _packet_size(text: str) -> int:
    from gpu_exporter.units import parse_size as size_of

    size = size_of(text)
    if size != 0 and not 1024 <= size <= 268_435_455:
        raise ValueError(f"{text!r} must be 0 (derived) or 1KiB to 268435455 bytes (the MQTT maximum)")
    return size


def _max_payload(text: str) -> int:
    from gpu_exporter.units import parse_size as size_of

    size = size_of(text)
    if size < 1024:
        raise ValueError(f"{text!r} is below the 1KiB minimum")
    if size > 1 << 30:
        raise ValueError(f"{text!r} is above the 1GiB maximum")
    return size


def _listen(text: str) -> str:
    value = str(text)
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {text!r} (use host:port or :port)")
    return value


def _idle_power(text: str) -> float | None:
    value = str(text).strip().lower().removesuffix("w")
    if value in ("", "auto"):
        return None
    try:
        watts = float(value)
    except ValueError:
        raise ValueError(f"invalid power {text!r} (use watts, e.g. 30 or 30W, or auto)") from None
    if not 0 <= watts <= 10000:
        raise ValueError(f"invalid power {text!r} (0 to 10000 watts)")
    return watts


def _path(text: str) -> str:
    value = str(text)
    if not value.startswith("/"):
        raise ValueError(f"invalid path {text!r} (must start with /)")
    return value


# --- forwarding parsers ---
def _mqtt_url(text: str) -> str:
    value = str(text).strip()
    if not value:
        return ""
    try:
        url = urlsplit(value)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"invalid MQTT URL {text!r}: {exc}") from None
    if url.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"invalid MQTT URL {text!r} (use mqtt://HOST[:PORT] or mqtts://HOST[:PORT])")
    if not url.hostname:
        raise ValueError(f"invalid MQTT URL {text!r}: no host")
    if url.username is not None or url.password is not None:
        raise ValueError(
            "put the MQTT user in --mqtt.username and the password in --mqtt.password-file, not in the URL"
        )
    if url.path not in ("", "/") or url.query or url.fragment:
        raise ValueError(f"invalid MQTT URL {text!r}: no path or query expected")
    if port == 0:
        raise ValueError(f"invalid MQTT URL {text!r}: port 0")
    return value


def _topic_prefix(text: str) -> str:
    value = str(text)
    if not value or value.startswith("/") or value.endswith("/") or any(c in value for c in "+#\0"):
        raise ValueError(f"invalid topic prefix {text!r} (no wildcards, no leading or trailing /)")
    return value


def _seconds_between(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if not low <= seconds <= high:
            raise ValueError(f"{text!r} is out of range ({low:g}s to {high:g}s)")
        return seconds

    return parse


def _size_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        size = parse_size(text)
        if not low <= size <= high:
            raise ValueError(f"{text!r} is out of range ({low} to {high} bytes)")
        return size

    return parse


def _digits(text: str) -> int:
    try:
        value = int(str(text), 10)
    except ValueError:
        raise ValueError(f"invalid number of digits {text!r}") from None
    if not 0 <= value <= 17:
        raise ValueError(f"digits must be 0 (exact) to 17, got {value}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(str(text))
    except ValueError:
        raise ValueError(f"invalid rate {text!r} (a number per second)") from None
    if not 0.01 <= value <= 100000:
        raise ValueError(f"rate {text!r} is out of range (0.01 to 100000 per second)")
    return value


@dataclass(frozen=True)
class Option:
    name: str  # the flag without dashes, also the YAML key
    field: str  # Config attribute
    parse: Callable[[str], Any]
    help: str
    metavar: str | None = None
    is_switch: bool = False  # a --collector.X / --no-collector.X pair


OPTIONS: tuple[Option, ...] = (
    Option(
        "gpu-vendor",
        "gpu_vendor",
        _choice(*VENDORS),
        "GPU library to read: auto picks what the machine has; fake simulates GPUs",
        "VENDOR",
    ),
    Option(
        "gpu-metrics-collection-interval",
        "interval",
        _interval,
        "how often GPUs are read, e.g. 500ms, 5s, 1m",
        "DURATION",
    ),
    Option(
        "metrics-buffer-size",
        "buffer_size",
        _int_between(1, 1_000_000),
        "samples kept in the ring buffer (the oldest is overwritten); it only needs to cover a pause of the "
        "forwarder or of pod attribution, 21 min at the default interval",
        "N",
    ),
    Option(
        "web.listen-address",
        "listen_address",
        _listen,
        "address for /metrics, /healthz, /readyz",
        "[HOST]:PORT",
    ),
    Option("web.telemetry-path", "telemetry_path", _path, "path under which metrics are served", "PATH"),
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
        _int_between(2, 10000),
        "open HTTP connections served at once; past it the connection waiting longest for its request is "
        "closed, or a 503 when all are busy (counted in gpu_exporter_http_connections_dropped_total)",
        "N",
    ),
    Option(
        "web.read-timeout",
        "web_read_timeout",
        _seconds_between(0.1, 600),
        "a request (and TLS handshake) must arrive in full within this time of the connection",
        "DURATION",
    ),
    Option(
        "web.idle-timeout",
        "web_idle_timeout",
        _seconds_between(1, 3600),
        "a keep-alive connection is closed after this long without a request",
        "DURATION",
    ),
    Option("node-name", "node_name", str, "node name (default: $NODE_NAME, else the hostname)", "NAME"),
    Option("log.level", "log_level", _choice("debug", "info", "warn", "error"), "log level", "LEVEL"),
    Option(
        "log.format",
        "log_format",
        _choice("logfmt", "json", "text"),
        "log format: logfmt (ts=... level=... caller=... msg=...) or json; text is logfmt too",
        "FORMAT",
    ),
    Option(
        "metrics.include",
        "metrics_include",
        _regex,
        "only serve and forward metrics whose name matches this regex",
        "REGEX",
    ),
    Option("metrics.exclude", "metrics_exclude", _regex, "drop metrics whose name matches this regex", "REGEX"),
    Option("fake.gpus", "fake_gpus", _int_between(1, 64), "simulated GPUs for --gpu-vendor=fake", "N"),
    Option(
        "fake.mig",
        "fake_mig",
        _nonneg_int,
        "MIG instances on the first simulated GPU (0 disables MIG; at most 7)",
        "N",
    ),
    Option("fake.seed", "fake_seed", _int_between(0, 2**32 - 1), "seed for the simulated values", "N"),
    Option(
        "fake.pcie-call-duration",
        "fake_pcie_call_seconds",
        _duration_at_least(0.0),
        "time each simulated PCIe throughput call blocks, as a real driver samples the link (e.g. 20ms)",
        "DURATION",
    ),
    Option("path.sysfs", "path_sysfs", _path, "sysfs mount point", "PATH"),
    Option("path.procfs", "path_procfs", _path, "procfs mount point", "PATH"),
    # --- forwarding options (store-and-forward) go below this line ---
    Option(
        "mqtt.url",
        "mqtt_url",
        _mqtt_url,
        "MQTT broker to forward batches to, mqtt://HOST[:PORT] or mqtts://HOST[:PORT]; off when empty",
        "URL",
    ),
    Option(
        "mqtt.protocol",
        "mqtt_protocol",
        _choice("5", "3.1.1"),
        "MQTT protocol version (3.1.1 for old edge brokers)",
        "VERSION",
    ),
    Option(
        "mqtt.topic-prefix",
        "mqtt_topic_prefix",
        _topic_prefix,
        "topic prefix: batches go to PREFIX/NODE/batch, status to PREFIX/NODE/status",
        "PREFIX",
    ),
    Option("mqtt.client-id", "mqtt_client_id", str, "MQTT client id (default: gpu-exporter-NODE)", "ID"),
    Option("mqtt.username", "mqtt_username", str, "MQTT user name", "USER"),
    Option("mqtt.password-file", "mqtt_password_file", str, "file holding the MQTT password (first line)", "FILE"),
    Option(
        "mqtt.tls.ca-file",
        "mqtt_tls_ca_file",
        str,
        "CA bundle to verify the broker (mqtts://; default: the system store)",
        "FILE",
    ),
    Option("mqtt.tls.cert-file", "mqtt_tls_cert_file", str, "client certificate for mutual TLS", "FILE"),
    Option("mqtt.tls.key-file", "mqtt_tls_key_file", str, "client key for mutual TLS", "FILE"),
    Option("mqtt.keepalive", "mqtt_keepalive", _seconds_between(5, 3600), "MQTT keepalive", "DURATION"),
    Option(
        "mqtt.reconnect-max-delay",
        "mqtt_reconnect_max_delay",
        _seconds_between(0.1, 3600),
        "longest wait between reconnect attempts (backoff doubles up to it, with jitter)",
        "DURATION",
    ),
    Option(
        "mqtt.batch-interval",
        "mqtt_batch_interval",
        _seconds_between(0.05, 86400),
        "close a batch after this long (it grows while the broker is unreachable; a GPU event closes it at once)",
        "DURATION",
    ),
    Option(
        "mqtt.batch-max-bytes",
        "mqtt_batch_max_bytes",
        _size_between(1024, 64 * 1024 * 1024),
        "close a batch when its payload would exceed this size",
        "SIZE",
    ),
    Option(
        "mqtt.batch-max-samples",
        "mqtt_batch_max_samples",
        _int_between(1, 100_000),
        "close a batch after this many samples",
        "N",
    ),
    Option(
        "mqtt.value-digits",
        "mqtt_value_digits",
        _digits,
        "significant digits forwarded for fractional gauge values (0: exact); counters and integers are always exact",
        "N",
    ),
    Option(
        "mqtt.max-rate",
        "mqtt_max_rate",
        _size_between(0, 1 << 40),
        "bytes per second forwarding may use (0: no cap); below what full resolution needs, summaries go "
        "first and full resolution follows when there is room",
        "BYTES",
    ),
    Option(
        "spool.dir",
        "spool_dir",
        str,
        "directory of the on-disk spool (batches wait here until the broker acknowledges them)",
        "DIR",
    ),
    Option(
        "spool.max-bytes",
        "spool_max_bytes",
        _size_between(64 * 1024, 1 << 50),
        "spool size cap; past it the oldest batches are dropped and counted",
        "SIZE",
    ),
    Option(
        "spool.max-age",
        "spool_max_age",
        _seconds_between(1, 10 * 365 * 86400),
        "batches older than this are dropped from the spool and counted",
        "DURATION",
    ),
    Option(
        "spool.replay-rate",
        "spool_replay_rate",
        _rate,
        "backlog batches sent per second after an outage (fresh batches go first)",
        "PER_SECOND",
    ),
    # --- bridge options go below this line ---
    Option(
        "bridge.group",
        "bridge_group",
        _group,
        "bridge: MQTT 5 shared-subscription group, so that several bridges split the load",
        "NAME",
    ),
    Option(
        "bridge.client-id",
        "bridge_client_id",
        str,
        "bridge: MQTT client id; keep it stable across restarts, the session is kept under it "
        "(default: gpu-exporter-bridge-<hostname>)",
        "ID",
    ),
    Option(
        "bridge.session-expiry",
        "bridge_session_expiry",
        _duration_at_least(1),
        "bridge: how long the broker keeps the session and its messages while the bridge is away",
        "DURATION",
    ),
    Option(
        "bridge.listen-address", "bridge_listen_address", _listen, "bridge: address of its own /metrics", "[HOST]:PORT"
    ),
    Option(
        "bridge.max-inflight",
        "bridge_max_inflight",
        _int_between(1, 65535),
        "bridge: unacknowledged messages the broker may send at once (MQTT 5 Receive Maximum)",
        "N",
    ),
    Option(
        "bridge.write-linger",
        "bridge_write_linger",
        _seconds_between(0, 60),
        "bridge: how long the writer waits for more messages before a remote write, so that messages "
        "arriving one at a time are written together; adds at most this much to the lag (0: no wait)",
        "DURATION",
    ),
    Option(
        "bridge.max-inflight-bytes",
        "bridge_max_inflight_bytes",
        _size_between(64 * 1024, 1 << 34),
        "bridge: payload bytes it holds unacknowledged; at this bound (or --bridge.max-inflight messages) "
        "it stops reading from the broker, which keeps the rest",
        "SIZE",
    ),
    Option(
        "bridge.max-payload",
        "bridge_max_payload",
        _max_payload,
        "bridge: larger payloads (compressed or inflated) are dropped and counted",
        "SIZE",
    ),
    Option(
        "bridge.max-packet-size",
        "bridge_max_packet_size",
        _packet_size,
        "bridge: MQTT 5 Maximum Packet Size announced to the broker, which then does not send larger "
        "messages (0: --bridge.max-payload plus 64KiB)",
        "SIZE",
    ),
    Option(
        "bridge.node-label",
        "bridge_node_label",
        _label_name,
        "bridge: label that carries the node name on every series",
        "NAME",
    ),
    Option(
        "bridge.series-cache",
        "bridge_series_cache",
        _int_between(1, 100_000_000),
        "bridge: bound of the per-device bookkeeping, in units of ~300 bytes (a device is about 6)",
        "N",
    ),
    Option(
        "bridge.max-series-per-node",
        "bridge_max_series_per_node",
        _positive_int,
        "bridge: distinct series one node may create; values of further series are dropped and counted",
        "N",
    ),
    Option(
        "bridge.max-series",
        "bridge_max_series",
        _int_between(1, 100_000_000),
        "bridge: distinct active series all nodes together may create; values of further series are dropped "
        "and counted",
        "N",
    ),
    Option(
        "bridge.new-nodes-per-minute",
        "bridge_new_nodes_per_minute",
        _int_between(1, 1_000_000),
        "bridge: new node names it starts to write per minute (not counted for the fleet it hears right after "
        "a start: its session's backlog and retained status messages); batches of further new names are "
        "dropped and counted",
        "N",
    ),
    Option(
        "bridge.max-clock-skew",
        "bridge_max_clock_skew",
        _duration_at_least(1),
        "bridge: a node's clock may be this far off the bridge's before its batches are corrected or "
        "refused (--bridge.clock-skew-policy); samples after the bridge's clock are never written",
        "DURATION",
    ),
    Option(
        "bridge.clock-skew-policy",
        "bridge_clock_skew_policy",
        _choice("correct", "refuse"),
        "bridge: batches of a node whose clock is off by more than --bridge.max-clock-skew: move their "
        "timestamps by the measured offset, or refuse them (counted per node)",
        "POLICY",
    ),
    Option(
        "bridge.state-dir",
        "bridge_state_dir",
        str,
        "bridge: folder for the record of what it wrote, so that a restarted bridge does not write again "
        "what the broker delivers again (an emptyDir in Kubernetes; empty: no record)",
        "DIR",
    ),
    Option(
        "remote-write.url",
        "remote_write_url",
        _http_url,
        "bridge: Prometheus remote-write endpoint, e.g. http://prometheus:9090/api/v1/write",
        "URL",
    ),
    Option("remote-write.username", "remote_write_username", str, "bridge: basic-auth user", "USER"),
    Option(
        "remote-write.password-file",
        "remote_write_password_file",
        str,
        "bridge: file holding the basic-auth password",
        "FILE",
    ),
    Option(
        "remote-write.bearer-token-file",
        "remote_write_bearer_token_file",
        str,
        "bridge: file holding a bearer token",
        "FILE",
    ),
    Option(
        "remote-write.tls.ca-file",
        "remote_write_tls_ca_file",
        str,
        "bridge: CA bundle to verify the remote-write server",
        "FILE",
    ),
    Option(
        "remote-write.tls.cert-file",
        "remote_write_tls_cert_file",
        str,
        "bridge: client certificate for the remote-write server",
        "FILE",
    ),
    Option(
        "remote-write.tls.key-file", "remote_write_tls_key_file", str, "bridge: key of the client certificate", "FILE"
    ),
    Option(
        "remote-write.tls.insecure-skip-verify",
        "remote_write_tls_insecure_skip_verify",
        _bool,
        "bridge: do not verify the server certificate (testing only)",
        "BOOL",
    ),
    Option(
        "remote-write.timeout",
        "remote_write_timeout",
        _duration_at_least(0.1, 600),
        "bridge: timeout of one remote-write request",
        "DURATION",
    ),
    Option(
        "remote-write.max-samples-per-request",
        "remote_write_max_samples",
        _int_between(1, 1_000_000),
        "bridge: larger writes are split into several requests",
        "N",
    ),
    Option(
        "remote-write.headers",
        "remote_write_headers",
        _headers,
        "bridge: extra HTTP headers, comma-separated Name=value (X-Scope-OrgID=fleet for Mimir, "
        "THANOS-TENANT=fleet for Thanos Receive)",
        "LIST",
    ),
    Option(
        "remote-write.max-backoff",
        "remote_write_max_backoff",
        _duration_at_least(0.01, 3600),
        "bridge: longest wait between retries of a failing write (5xx, 429, network)",
        "DURATION",
    ),
    # --- kubernetes options go below this line ---
    Option(
        "metrics.naming",
        "metrics_naming",
        _choice("native", "dcgm"),
        "metric names on /metrics: native (gpu_*) or dcgm (dcgm-exporter's DCGM_FI_* names, units "
        "and labels, for its dashboards and alerts)",
        "STYLE",
    ),
    Option(
        "k8s.pod-attribution",
        "k8s_pod_attribution",
        _bool,
        "map GPU processes to Kubernetes pods (gpu_pod_* metrics), in the background",
        "BOOL",
    ),
    Option(
        "k8s.kubelet-socket",
        "k8s_kubelet_socket",
        _path,
        "kubelet pod-resources socket; when absent (KubeEdge) pods are found through /proc cgroups",
        "PATH",
    ),
    Option(
        "k8s.pod-logs-path",
        "k8s_pod_logs_path",
        _path,
        "the kubelet's pod log directory, whose names give namespace, pod and container "
        "(its sibling containers/ maps container IDs to names)",
        "PATH",
    ),
    Option(
        "k8s.idle-power",
        "k8s_idle_power",
        _idle_power,
        "GPU idle power in watts, subtracted before energy is split among pods "
        "(default: the lowest power seen on each GPU)",
        "WATTS",
    ),
    Option(
        "k8s.refresh-interval",
        "k8s_refresh_interval",
        _interval,
        "how often the pod log directories are re-indexed (a new pod is looked up at once)",
        "DURATION",
    ),
)

_SWITCHES = tuple(
    Option(f"collector.{group}", f"collector.{group}", _bool, f"collect the {group} metrics", is_switch=True)
    for group in catalog.GROUPS
)

ALL_OPTIONS = OPTIONS + _SWITCHES
_BY_NAME = {o.name: o for o in ALL_OPTIONS}


def env_name(option_name: str) -> str:
    return ENV_PREFIX + re.sub(r"[.\-]", "_", option_name).upper()


def add_arguments(parser: argparse.ArgumentParser, include: Callable[[str], bool] | None = None) -> None:
    """Declare the options (those ``include`` accepts by name) as flags; defaults are SUPPRESSed so that
    we see what was given."""
    parser.add_argument(
        "--config.file",
        dest="config.file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"YAML file with any of these options (env {env_name('config.file')})",
    )
    for opt in OPTIONS:
        if include is not None and not include(opt.name):
            continue
        default = getattr(Config(), opt.field)
        if isinstance(default, float) and opt.metavar == "DURATION":
            default = format_duration(default)
        shown = f" (default: {default})" if default not in ("", None) else ""
        parser.add_argument(
            f"--{opt.name}",
            dest=opt.name,
            metavar=opt.metavar,
            default=argparse.SUPPRESS,
            help=f"{opt.help}{shown}",
        )
    group = parser.add_argument_group("collectors (all enabled by default)")
    for opt in _SWITCHES:
        group.add_argument(
            f"--{opt.name}",
            dest=opt.name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=opt.help,
        )


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, int]]:
    lines: Mapping[str, int] = data.get("__lines__", {})
    out: dict[str, tuple[Any, int]] = {}
    for key, value in data.items():
        if key == "__lines__":
            continue
        name = f"{prefix}{str(key).replace('_', '-')}"
        if isinstance(value, Mapping) and f"{name}" not in _BY_NAME:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = (value, lines.get(key, 0))
    return out


def read_file(path: str) -> dict[str, tuple[Any, int]]:
    from gpu_exporter import safeyaml  # bounded size and depth, no aliases, UTF-8 only

    try:
        data = safeyaml.load_file(path, what="config file")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"invalid config file {path}: expected a mapping of option names to values")
    return _flatten(data)


def load(args: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Config:
    """Merge the sources into a Config, or raise ConfigError naming the source of a bad value."""
    environ = os.environ if environ is None else environ
    values: dict[str, tuple[Any, str]] = {}

    config_file = args.get("config.file") or environ.get(env_name("config.file"), "")
    if config_file:
        for name, (value, line) in read_file(config_file).items():
            if name not in _BY_NAME:
                raise ConfigError(f"{config_file}:{line}: unknown option {name!r}")
            values[name] = (value, f"{config_file}:{line}")
    for opt in ALL_OPTIONS:
        env = env_name(opt.name)
        if env in environ:
            values[opt.name] = (environ[env], f"environment variable {env}")
        if opt.name in args:
            values[opt.name] = (args[opt.name], f"flag --{opt.name}")

    fields: dict[str, Any] = {}
    disabled: set[str] = set()
    for name, (raw, source) in values.items():
        opt = _BY_NAME[name]
        if isinstance(raw, (list, dict)):  # str() of a YAML list would pass as a value: ['a', 'b'] is a regex
            what = "a list" if isinstance(raw, list) else "a mapping"
            raise ConfigError(f"{source}: --{name} takes one value, not {what} (join several with '|' or ',')")
        try:
            parsed = opt.parse(str(raw).lower() if isinstance(raw, bool) else str(raw))
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if opt.is_switch:
            if not parsed:
                disabled.add(name.split(".", 1)[1])
        else:
            fields[opt.field] = parsed
    fields["disabled_collectors"] = frozenset(disabled)
    fields["config_file"] = str(config_file)
    if not fields.get("node_name"):
        fields["node_name"] = environ.get("NODE_NAME") or socket.gethostname()
    config = Config(**fields)
    _check(config)
    return config


def _check(config: Config) -> None:
    if config.fake_mig > 7:
        raise ConfigError(f"--fake.mig={config.fake_mig}: a GPU holds at most 7 MIG instances")
    if config.web_config_file:
        from gpu_exporter.web.webconfig import load_web_config

        try:
            load_web_config(config.web_config_file)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if not config.mqtt_url:  # a label value only; with forwarding a topic level too (_check_forwarding)
        _check_mqtt_string("node-name", config.node_name, MAX_NODE_NAME)
    _check_forwarding(config)


def _check_forwarding(config: Config) -> None:
    """Files the forwarder needs must be readable at start, so that a typo fails fast (exit 2)."""
    if not config.mqtt_url:
        return
    files = {
        "mqtt.password-file": config.mqtt_password_file,
        "mqtt.tls.ca-file": config.mqtt_tls_ca_file,
        "mqtt.tls.cert-file": config.mqtt_tls_cert_file,
        "mqtt.tls.key-file": config.mqtt_tls_key_file,
    }
    for flag, path in files.items():
        if path:
            try:
                with open(path, "rb") as handle:
                    handle.read(1)
            except OSError as exc:
                raise ConfigError(f"--{flag}={path}: cannot read: {exc.strerror}") from None
    if config.mqtt_tls_key_file and not config.mqtt_tls_cert_file:
        raise ConfigError("--mqtt.tls.key-file needs --mqtt.tls.cert-file")
    if (config.mqtt_tls_ca_file or config.mqtt_tls_cert_file) and not config.mqtt_url.startswith("mqtts://"):
        raise ConfigError("TLS files are set but --mqtt.url is not mqtts://")
    if config.mqtt_password_file and not config.mqtt_username:
        raise ConfigError("--mqtt.password-file needs --mqtt.username")
    _check_topic_level("node-name", config.node_name)
    for level in config.mqtt_topic_prefix.split("/"):
        _check_topic_level("mqtt.topic-prefix", level, config.mqtt_topic_prefix)
    _check_identity(config)
    if config.mqtt_url.startswith("mqtts://"):
        tls_context(config)  # a CA bundle, certificate or key that does not load is a start-up error


MAX_NODE_NAME = 253  # bytes: a Kubernetes node name's limit, far within MQTT's 65535 for a whole topic
# Identity bounds, in bytes of UTF-8 (docs/forwarding.md, "Identity"): MQTT allows 65535 for each, brokers
# far less (a client id of 23 bytes is all the spec guarantees; AWS IoT and Azure IoT Hub take 128).
MAX_CLIENT_ID = 256
MAX_USERNAME = 1024  # Azure IoT Hub's user names ("HUB/DEVICE/?api-version=...") run to a few hundred
MAX_TOPIC_PREFIX = 256
MAX_PASSWORD = 65535  # MQTT's own limit for the password field: tokens (JWTs) can be long


def _check_identity(config: Config) -> None:
    """What the agent says about itself to the broker, bounded at start: one line and exit 2, never a
    connection that fails every turn."""
    if config.mqtt_client_id:
        _check_mqtt_string("mqtt.client-id", config.mqtt_client_id, MAX_CLIENT_ID)
    if config.mqtt_username:
        _check_mqtt_string("mqtt.username", config.mqtt_username, MAX_USERNAME)
    size = len(config.mqtt_topic_prefix.encode("utf-8", "surrogatepass"))
    if size > MAX_TOPIC_PREFIX:
        raise ConfigError(f"--mqtt.topic-prefix: {size} bytes long, at most {MAX_TOPIC_PREFIX}")
    if config.mqtt_password_file:
        with open(config.mqtt_password_file, "rb") as handle:  # readable: checked above
            line = handle.readline(MAX_PASSWORD + 2).rstrip(b"\r\n")
        if len(line) > MAX_PASSWORD:
            raise ConfigError(
                f"--mqtt.password-file={config.mqtt_password_file}: its first line is over {MAX_PASSWORD} "
                "bytes, MQTT's limit for a password"
            )


def _check_mqtt_string(flag: str, value: str, limit: int) -> None:
    """An MQTT UTF-8 string field of at most ``limit`` bytes, without NUL or other control characters."""
    bad = sorted({c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F})
    if bad:
        shown = ", ".join(repr(c) for c in bad[:3])
        raise ConfigError(f"--{flag}: contains control characters ({shown})")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError(f"--{flag}: not valid UTF-8") from None
    if size > limit:
        raise ConfigError(f"--{flag}: {size} bytes long, at most {limit}")


def _check_topic_level(flag: str, level: str, whole: str = "") -> None:
    """Batches go to ``PREFIX/NODE/batch``: each part must be a valid MQTT topic level, or none arrives."""
    value = whole or level
    bad = sorted({c for c in level if c in "/+#\0" or ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F})
    if not level and not whole:  # an empty level inside the prefix is valid MQTT; an empty node name is not
        raise ConfigError(f"--{flag}={value!r}: an empty MQTT topic level")
    if bad and not (whole and bad == ["/"]):
        shown = ", ".join(repr(c) for c in bad)
        raise ConfigError(f"--{flag}={value!r}: cannot be part of an MQTT topic (contains {shown})")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigError(f"--{flag}={value!r}: not valid UTF-8, cannot be part of an MQTT topic") from None
    if flag == "node-name" and size > MAX_NODE_NAME:
        raise ConfigError(f"--{flag}: {size} bytes long, at most {MAX_NODE_NAME} (it is an MQTT topic level)")


def tls_context(config: Config) -> ssl.SSLContext:
    """The TLS settings for mqtts://, or ConfigError naming the file that does not load."""
    import ssl

    try:
        ctx = ssl.create_default_context(cafile=config.mqtt_tls_ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--mqtt.tls.ca-file={config.mqtt_tls_ca_file}: cannot load: {error_reason(exc)}") from None
    if config.mqtt_tls_cert_file:
        try:
            ctx.load_cert_chain(config.mqtt_tls_cert_file, config.mqtt_tls_key_file or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"--mqtt.tls.cert-file={config.mqtt_tls_cert_file}: cannot load the certificate and key: {error_reason(exc)}"
            ) from None
    return ctx


def error_reason(exc: BaseException) -> str:
    """The useful part of an OSError or SSL error, for one-line messages."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return exc.verify_message or str(exc)
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def replace(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, **changes)


def option_names() -> Sequence[str]:
    return [o.name for o in ALL_OPTIONS]
