"""Checks across options, made once at start: one line and exit 2, never a daemon that fails every turn."""

from __future__ import annotations

from gpu_exporter.config.model import Config
from gpu_exporter.config.parsers import ConfigError
from gpu_exporter.mqtt.tls import tls_context

__all__ = ["MAX_CLIENT_ID", "MAX_NODE_NAME", "MAX_PASSWORD", "MAX_TOPIC_PREFIX", "MAX_USERNAME", "check"]


def check(config: Config) -> None:
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
        tls_context(
            config.mqtt_tls_ca_file, config.mqtt_tls_cert_file, config.mqtt_tls_key_file
        )  # a CA bundle, certificate or key that does not load is a start-up error


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
