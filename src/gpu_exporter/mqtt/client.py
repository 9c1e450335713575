"""The one place a paho-mqtt client is built: protocol, client id, credentials and TLS from ``LinkSettings``.

The caller reads the password first (``settings.read_password``), so that each command says in its own
words that the file cannot be read, and then adds what only it needs (callbacks, will, windows)."""

from __future__ import annotations

import logging
import time
from typing import Any, cast

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gpu_exporter.mqtt.settings import LinkSettings, read_password

__all__ = ["new_client", "reread_password_on_reconnect"]

log = logging.getLogger(__name__)


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


def reread_password_on_reconnect(client: paho.Client, settings: LinkSettings) -> None:
    """For a client that reconnects by itself (paho's loop): the password file read again before each
    connection, as the agent reads it before each of its own, so that a rotated Secret is used from the
    next connection on, with no restart. A file that cannot be read keeps the last password (a warning at
    most once a minute)."""
    if not (settings.username and settings.password_file):
        return
    last_warning = [-60.0]

    def reread(client: paho.Client, userdata: Any) -> None:
        try:
            password = read_password(settings)
        except OSError as exc:
            now = time.monotonic()
            if now - last_warning[0] >= 60.0:
                last_warning[0] = now
                reason = exc.strerror or exc
                log.warning(
                    "cannot read --mqtt.password-file=%s (%s); the last password read is sent",
                    settings.password_file,
                    reason,
                )
            return
        client.username_pw_set(settings.username, cast(str, password))  # paho sends bytes as they are

    client.on_pre_connect = reread
