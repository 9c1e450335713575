"""Store-and-forward options: the MQTT link to the broker (``mqtt/``), batches and the on-disk spool."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.config.parsers import (
    Option,
    choice,
    int_between,
    parse_digits,
    parse_mqtt_url,
    parse_rate,
    parse_topic_prefix,
    seconds_between,
    size_between,
)

__all__ = ["FORWARD_OPTIONS", "MQTT_CONNECTION", "SUBSCRIBER_HELP", "ForwardOptions"]


@dataclass(frozen=True)
class ForwardOptions:
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


FORWARD_OPTIONS: tuple[Option, ...] = (
    Option(
        "mqtt.url",
        "mqtt_url",
        parse_mqtt_url,
        "MQTT broker to forward batches to, mqtt://HOST[:PORT] or mqtts://HOST[:PORT]; off when empty",
        "URL",
    ),
    Option(
        "mqtt.protocol",
        "mqtt_protocol",
        choice("5", "3.1.1"),
        "MQTT protocol version (3.1.1 for old edge brokers)",
        "VERSION",
    ),
    Option(
        "mqtt.topic-prefix",
        "mqtt_topic_prefix",
        parse_topic_prefix,
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
    Option("mqtt.keepalive", "mqtt_keepalive", seconds_between(5, 3600), "MQTT keepalive", "DURATION"),
    Option(
        "mqtt.reconnect-max-delay",
        "mqtt_reconnect_max_delay",
        seconds_between(0.1, 3600),
        "longest wait between reconnect attempts (backoff doubles up to it, with jitter)",
        "DURATION",
    ),
    Option(
        "mqtt.batch-interval",
        "mqtt_batch_interval",
        seconds_between(0.05, 86400),
        "close a batch after this long (it grows while the broker is unreachable; a GPU event closes it at once)",
        "DURATION",
    ),
    Option(
        "mqtt.batch-max-bytes",
        "mqtt_batch_max_bytes",
        size_between(1024, 64 * 1024 * 1024),
        "close a batch when its payload would exceed this size",
        "SIZE",
    ),
    Option(
        "mqtt.batch-max-samples",
        "mqtt_batch_max_samples",
        int_between(1, 100_000),
        "close a batch after this many samples",
        "N",
    ),
    Option(
        "mqtt.value-digits",
        "mqtt_value_digits",
        parse_digits,
        "significant digits forwarded for fractional gauge values (0: exact); counters and integers are always exact",
        "N",
    ),
    Option(
        "mqtt.max-rate",
        "mqtt_max_rate",
        size_between(0, 1 << 40),
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
        size_between(64 * 1024, 1 << 50),
        "spool size cap; past it the oldest batches are dropped and counted",
        "SIZE",
    ),
    Option(
        "spool.max-age",
        "spool_max_age",
        seconds_between(1, 10 * 365 * 86400),
        "batches older than this are dropped from the spool and counted",
        "DURATION",
    ),
    Option(
        "spool.replay-rate",
        "spool_replay_rate",
        parse_rate,
        "backlog batches sent per second after an outage (fresh batches go first)",
        "PER_SECOND",
    ),
)

# The broker connection: the bridge subscribes with these too (config/commands.py).
MQTT_CONNECTION = (
    "mqtt.url",
    "mqtt.topic-prefix",
    "mqtt.username",
    "mqtt.password-file",
    "mqtt.tls.ca-file",
    "mqtt.tls.cert-file",
    "mqtt.tls.key-file",
    "mqtt.keepalive",
)

# The rows whose help speaks of publishing, as the commands that subscribe (``bridge``, ``tail``) show them.
SUBSCRIBER_HELP = {
    "mqtt.url": "MQTT broker the edge nodes publish their batches to, mqtt://HOST[:PORT] or mqtts://HOST[:PORT] "
    "(required)",
    "mqtt.topic-prefix": "topic prefix: batches are read from PREFIX/NODE/batch",
}
