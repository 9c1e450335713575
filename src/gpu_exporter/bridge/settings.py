"""What the bridge runs with: ``BridgeSettings``, the MQTT packet size it announces from them, and the
link settings (``mqtt/``) its client is built from."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpu_exporter.bridge.options import BridgeOptions, RemoteWriteOptions
from gpu_exporter.forward.options import ForwardOptions
from gpu_exporter.mqtt.settings import LinkSettings, broker_address
from gpu_exporter.mqtt.tls import tls_context

__all__ = [
    "MQTT_MAX_PACKET",
    "OPTION",
    "PACKET_OVERHEAD",
    "RECONNECT_MAX_DELAY",
    "BridgeSettings",
    "connect_properties",
    "link_settings",
    "max_packet_size",
    "new_nodes_burst",
]

# What a PUBLISH carries besides its payload: fixed header, topic, properties (the agent's are a few dozen
# bytes; the topic is at most a node name of 1024 characters and the prefix).
PACKET_OVERHEAD = 64 * 1024
MQTT_MAX_PACKET = 268_435_455  # the largest MQTT can express
RECONNECT_MAX_DELAY = 10.0  # seconds: the bridge is the broker's neighbour, and backlogs wait for it


OPTION = "option"  # the metadata key that names the config field a setting is copied from


def _option(section: type[Any], name: str) -> Any:
    """A setting that is option field ``name`` of a config section: the option's default is its default,
    and ``settings_from`` (bridge/cli.py) copies the option's value into it."""
    default = next(f.default for f in fields(section) if f.name == name)
    return field(default=default, metadata={OPTION: name})


@dataclass(frozen=True)
class BridgeSettings:
    """What the bridge runs with. The settings named after an option (``_option``) come from the
    config's sections (``bridge/options.py``, ``forward/options.py``); the rest are read from files
    (passwords, tokens), derived (client id, headers) or not options at all."""

    mqtt_url: str = field(metadata={OPTION: "mqtt_url"})
    remote_write_url: str = field(metadata={OPTION: "remote_write_url"})
    topic_prefix: str = _option(ForwardOptions, "mqtt_topic_prefix")
    mqtt_username: str = _option(ForwardOptions, "mqtt_username")
    mqtt_password: bytes | None = None  # read from --mqtt.password-file (mqtt.settings.read_password_bytes)
    mqtt_password_file: str = _option(ForwardOptions, "mqtt_password_file")  # read again at each reconnection
    mqtt_ca_file: str = _option(ForwardOptions, "mqtt_tls_ca_file")
    mqtt_cert_file: str = _option(ForwardOptions, "mqtt_tls_cert_file")
    mqtt_key_file: str = _option(ForwardOptions, "mqtt_tls_key_file")
    group: str = _option(BridgeOptions, "bridge_group")  # shared subscription group; empty: a plain subscription
    client_id: str = "gpu-exporter-bridge"
    session_expiry: float = _option(BridgeOptions, "bridge_session_expiry")
    keepalive: float = _option(ForwardOptions, "mqtt_keepalive")  # seconds
    # also the bridge's own bound on messages held unacknowledged
    receive_maximum: int = _option(BridgeOptions, "bridge_max_inflight")
    max_inflight_bytes: int = _option(BridgeOptions, "bridge_max_inflight_bytes")
    # announced in CONNECT; 0: max_payload + PACKET_OVERHEAD
    max_packet_size: int = _option(BridgeOptions, "bridge_max_packet_size")
    max_messages: int = 100  # messages per remote write
    # seconds the writer waits for more messages before a write (coalescing)
    linger: float = _option(BridgeOptions, "bridge_write_linger")
    max_payload: int = _option(BridgeOptions, "bridge_max_payload")
    node_label: str = _option(BridgeOptions, "bridge_node_label")
    rw_timeout: float = _option(RemoteWriteOptions, "remote_write_timeout")
    rw_username: str = _option(RemoteWriteOptions, "remote_write_username")
    rw_password: str = ""
    rw_bearer_token: str = ""
    rw_ca_file: str = _option(RemoteWriteOptions, "remote_write_tls_ca_file")
    rw_cert_file: str = _option(RemoteWriteOptions, "remote_write_tls_cert_file")
    rw_key_file: str = _option(RemoteWriteOptions, "remote_write_tls_key_file")
    rw_insecure_skip_verify: bool = _option(RemoteWriteOptions, "remote_write_tls_insecure_skip_verify")
    rw_max_samples: int = _option(RemoteWriteOptions, "remote_write_max_samples")
    rw_backoff_max: float = _option(RemoteWriteOptions, "remote_write_max_backoff")
    rw_headers: tuple[tuple[str, str], ...] = ()
    dedup_streams: int = 100_000
    series_cache: int = _option(BridgeOptions, "bridge_series_cache")
    max_series_per_node: int = _option(BridgeOptions, "bridge_max_series_per_node")
    max_series: int = _option(BridgeOptions, "bridge_max_series")
    new_nodes_per_minute: int = _option(BridgeOptions, "bridge_new_nodes_per_minute")
    new_nodes_burst: int = _option(BridgeOptions, "bridge_new_nodes_burst")  # 0: max_series / 100
    readiness_timeout: float = _option(BridgeOptions, "bridge_readiness_timeout")
    max_clock_skew: float = _option(BridgeOptions, "bridge_max_clock_skew")
    clock_skew_policy: str = _option(BridgeOptions, "bridge_clock_skew_policy")
    # where the record of what was written is kept; empty: nowhere
    state_dir: str = _option(BridgeOptions, "bridge_state_dir")


def new_nodes_burst(settings: BridgeSettings) -> int:
    """New node names admitted at once: the setting, else one per 100 series of the fleet budget (an
    8-GPU node has about 850 series, one GPU about 110), so a rollout of the fleet that
    --bridge.max-series was sized for is admitted at once."""
    return settings.new_nodes_burst or max(settings.new_nodes_per_minute, settings.max_series // 100)


def max_packet_size(settings: BridgeSettings) -> int:
    """The Maximum Packet Size the bridge announces: the setting, else its payload limit plus room for
    the PUBLISH's header, topic and properties."""
    return min(settings.max_packet_size or settings.max_payload + PACKET_OVERHEAD, MQTT_MAX_PACKET)


def link_settings(settings: BridgeSettings) -> LinkSettings:
    """The broker's address, TLS (the agent's ``tls_context``: mqtts:// verifies the broker against
    --mqtt.tls.ca-file or the system store, with an optional client certificate) and the client's
    identity; MQTT 5 always. ConfigError (one line) when a TLS file does not load."""
    host, port, secure = broker_address(settings.mqtt_url)
    tls = tls_context(settings.mqtt_ca_file, settings.mqtt_cert_file, settings.mqtt_key_file) if secure else None
    return LinkSettings(
        host=host,
        port=port,
        tls=tls,
        protocol="5",
        client_id=settings.client_id,
        username=settings.mqtt_username,
        password_file=settings.mqtt_password_file,  # read at start (mqtt_password), again at each reconnection
        keepalive=round(settings.keepalive),  # --mqtt.keepalive is 5s or more; tests use less
        max_delay=RECONNECT_MAX_DELAY,
        window=settings.receive_maximum,
        max_incoming=max_packet_size(settings),
    )


def connect_properties(settings: BridgeSettings) -> Properties:
    """What the bridge's CONNECT announces: a session kept ``session_expiry`` seconds after a disconnection
    (with clean_start False, whatever was not acknowledged is delivered again), Receive Maximum (its own
    bound on messages held) and Maximum Packet Size."""
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.SessionExpiryInterval = int(settings.session_expiry)
    props.ReceiveMaximum = settings.receive_maximum
    props.MaximumPacketSize = max_packet_size(settings)
    return props
