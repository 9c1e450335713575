"""The one place a paho-mqtt client is built: protocol, client id, credentials and TLS from ``LinkSettings``.

The caller reads the password first (``settings.read_password``), so that each command says in its own
words that the file cannot be read, and then adds what only it needs (callbacks, will, windows)."""

from __future__ import annotations

from typing import cast

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gpu_exporter.mqtt.settings import LinkSettings

__all__ = ["new_client"]


def new_client(settings: LinkSettings, password: bytes | None, *, reconnect_on_failure: bool = True) -> paho.Client:
    """A paho client (callback API 2) for ``settings``; a clean session on either protocol."""
    v5 = settings.protocol == "5"
    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2,
        client_id=settings.client_id,
        protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
        clean_session=None if v5 else True,
        reconnect_on_failure=reconnect_on_failure,
    )
    if settings.username:
        client.username_pw_set(settings.username, cast(str, password))  # paho sends bytes as they are
    if settings.tls is not None:
        client.tls_set_context(settings.tls)
    return client
