"""Where the broker is and how to reach it: ``LinkSettings`` from the configuration, the password file read
one way (as bytes), and the broker's address from ``--mqtt.url``."""

from __future__ import annotations

import errno
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpu_exporter.config import Config
from gpu_exporter.mqtt.tls import tls_context

__all__ = [
    "LINK_FIELDS",
    "LINK_LIVE",
    "LINK_TUNING",
    "OWN_MAX_PACKET",
    "LinkSettings",
    "broker_address",
    "read_password",
    "read_password_bytes",
]

OWN_MAX_PACKET = 64 * 1024  # what the agent accepts: CONNACK, PUBACK, DISCONNECT are small
_PASSWORD_MAX = 65535  # bytes: MQTT's limit for the password field
# The reload rules of the link, in one place (reload.LIVE takes them from here, forward/service.py applies
# them). The options a connection is made from: a reload that changes one of them reconnects the
# forwarder with fresh settings.
LINK_FIELDS = (
    "mqtt_url",
    "mqtt_username",
    "mqtt_password_file",
    "mqtt_tls_ca_file",
    "mqtt_tls_cert_file",
    "mqtt_tls_key_file",
    "mqtt_keepalive",
    "mqtt_reconnect_max_delay",
)
# The options the forwarder applies to the open connection on a reload.
LINK_TUNING = ("mqtt_max_rate",)
# Every link option a reload changes while running.
LINK_LIVE = (*LINK_FIELDS, *LINK_TUNING)


def broker_address(url: str) -> tuple[str, int, bool]:
    """Host, port and whether TLS is on, from an ``mqtt://`` or ``mqtts://`` URL (validated by config)."""
    parts = urlsplit(url)
    secure = parts.scheme == "mqtts"
    return parts.hostname or "", parts.port or (8883 if secure else 1883), secure


@dataclass(frozen=True)
class LinkSettings:
    host: str
    port: int
    tls: ssl.SSLContext | None
    protocol: str  # "5" or "3.1.1"
    client_id: str
    username: str
    password_file: str
    keepalive: int
    max_delay: float
    window: int  # most batches in flight at once
    max_incoming: int = OWN_MAX_PACKET  # Maximum Packet Size announced in CONNECT (MQTT 5)

    @classmethod
    def from_config(cls, config: Config, client_id: str | None = None, window: int = 16) -> LinkSettings:
        host, port, secure = broker_address(config.mqtt_url)
        return cls(
            host=host,
            port=port,
            tls=tls_context(config.mqtt_tls_ca_file, config.mqtt_tls_cert_file, config.mqtt_tls_key_file)
            if secure
            else None,
            protocol=config.mqtt_protocol,
            client_id=client_id or config.mqtt_client_id or f"gpu-exporter-{config.node_name}",
            username=config.mqtt_username,
            password_file=config.mqtt_password_file,
            keepalive=max(5, round(config.mqtt_keepalive)),
            max_delay=config.mqtt_reconnect_max_delay,
            window=window,
        )


def read_password_bytes(path: str) -> bytes:
    """First line of the password file, as bytes: an MQTT password is binary data, UTF-8 or not (re-read
    at every connection, so a rotated secret is picked up)."""
    with open(path, "rb") as handle:
        line = handle.readline(_PASSWORD_MAX + 2).rstrip(b"\r\n")
    if len(line) > _PASSWORD_MAX:  # a file rotated to something else: never read it whole
        raise OSError(errno.EFBIG, f"its first line is over {_PASSWORD_MAX} bytes, MQTT's limit for a password")
    return line


def read_password(settings: LinkSettings) -> bytes | None:
    """The password to send (None without a password file); raises OSError when the file cannot be read."""
    return read_password_bytes(settings.password_file) if settings.password_file else None
