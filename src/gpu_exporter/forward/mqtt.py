"""The broker connection: one paho-mqtt client per connection, driven by the forwarder's own thread.

Why a fresh client for every connection: paho keeps unacknowledged messages across reconnects and,
for a message published while offline, reports a failed ``MQTTMessageInfo`` yet still queues it. The
spool is our queue, so each connection starts empty, we publish only while connected, and an in-flight
window no larger than paho's ``max_inflight`` keeps paho from queueing at all.

Errors a user can cause (broker down, wrong password, untrusted certificate) end up as one log line
each time the error changes, not once per retry; the agent keeps sampling and spooling meanwhile.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from gpu_exporter.config import Config, tls_context
from gpu_exporter.config import error_reason as _reason
from gpu_exporter.forward import sendtime

__all__ = ["Link", "LinkSettings", "tls_context"]

log = logging.getLogger("gpu_exporter.forward")

_FIRST_DELAY = 0.5  # seconds before the first retry; doubles up to the configured cap


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

    @classmethod
    def from_config(cls, config: Config, client_id: str | None = None, window: int = 16) -> LinkSettings:
        url = urlsplit(config.mqtt_url)
        secure = url.scheme == "mqtts"
        return cls(
            host=url.hostname or "",
            port=url.port or (8883 if secure else 1883),
            tls=tls_context(config) if secure else None,
            protocol=config.mqtt_protocol,
            client_id=client_id or config.mqtt_client_id or f"gpu-exporter-{config.node_name}",
            username=config.mqtt_username,
            password_file=config.mqtt_password_file,
            keepalive=max(5, round(config.mqtt_keepalive)),
            max_delay=config.mqtt_reconnect_max_delay,
            window=window,
        )


def read_password(path: str) -> str:
    """First line of the password file (re-read at every connection, so a rotated secret is picked up)."""
    with open(path, encoding="utf-8") as handle:
        return handle.readline().rstrip("\r\n")


class Link:
    """Connect, publish, read acknowledgements; all from the caller's thread, never blocking long."""

    def __init__(
        self,
        settings: LinkSettings,
        will_topic: str,
        on_ack: Callable[[int, bool, str], None],
        on_up: Callable[[], None],
        on_down: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.will_topic = will_topic
        self._on_ack = on_ack
        self._on_up = on_up
        self._on_down = on_down
        self._clock = clock
        self._client: paho.Client | None = None
        self.state = "down"  # down -> connecting -> up -> down
        self._attempt = 0
        self._next_attempt = 0.0
        self._connect_deadline = 0.0
        self._last_error = ""
        self.error = ""  # the current problem, "" while connected
        self.error_kind = ""  # unreachable, refused, auth, tls, lost, protocol
        self.connect_errors = 0

    @property
    def up(self) -> bool:
        return self.state == "up"

    # ------------------------------------------------------------------------------------- driving

    def step(self, timeout: float) -> None:
        """Do what is due: a connection attempt, network I/O for up to ``timeout`` seconds."""
        now = self._clock()
        if self.state == "down":
            if now >= self._next_attempt:
                self._connect()
            else:
                return
        client = self._client
        if client is None:
            return
        if self.state == "connecting" and now > self._connect_deadline:
            self._fail("unreachable", f"broker at {self._where()} did not answer CONNECT in time")
            return
        rc = client.loop(timeout=timeout)
        if rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS,) and self._client is client and self.state != "down":
            self._fail("lost", f"connection to broker at {self._where()} lost: {paho.error_string(rc)}")

    def wait_hint(self) -> float:
        """Seconds until the next connection attempt (0 when not waiting for one)."""
        if self.state != "down":
            return 0.0
        return max(0.0, self._next_attempt - self._clock())

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> int | None:
        """Publish at QoS 1; the message id, or None when the client refused (not connected)."""
        client = self._client
        if client is None or self.state != "up":
            return None
        # MQTT 5: stamped with the send time here, at publish (forward/sendtime.py)
        props = sendtime.properties() if self.settings.protocol == "5" else None
        info = client.publish(topic, payload, qos=1, retain=retain, properties=props)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            log.debug("publish refused by the client: %s", paho.error_string(info.rc))
            return None
        return int(info.mid)

    def close(self, status: bytes | None = None, flush: float = 1.0) -> None:
        """Say goodbye (retained status, then DISCONNECT, so the will is not sent) and drop the client."""
        client = self._client
        if client is None:
            return
        if self.state == "up":
            self.state = "closing"  # our own DISCONNECT is no lost connection
            if status is not None:
                client.publish(self.will_topic, status, qos=1, retain=True)
            client.disconnect()
            deadline = self._clock() + flush
            while self._client is client and self._clock() < deadline:
                if client.loop(timeout=0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    break
        self._drop_client()
        self.state = "down"

    # ------------------------------------------------------------------------------------- internals

    def _where(self) -> str:
        return f"{self.settings.host}:{self.settings.port}"

    def _connect(self) -> None:
        s = self.settings
        v5 = s.protocol == "5"
        client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=s.client_id,
            protocol=MQTTProtocolVersion.MQTTv5 if v5 else MQTTProtocolVersion.MQTTv311,
            clean_session=None if v5 else True,
            reconnect_on_failure=False,
        )
        client.max_inflight_messages_set(s.window)
        client.max_queued_messages_set(s.window)
        client.connect_timeout = 5.0
        client.will_set(self.will_topic, b"offline", qos=1, retain=True)
        if s.username:
            password = None
            if s.password_file:
                try:
                    password = read_password(s.password_file)
                except OSError as exc:
                    self._fail("auth", f"cannot read --mqtt.password-file={s.password_file}: {_reason(exc)}")
                    return
            client.username_pw_set(s.username, password)
        if s.tls is not None:
            client.tls_set_context(s.tls)
        client.on_connect = self._connected
        client.on_disconnect = self._disconnected
        client.on_publish = self._published
        self._client = client
        self.state = "connecting"
        self._connect_deadline = self._clock() + 15.0
        try:
            client.connect(s.host, s.port, keepalive=s.keepalive, clean_start=True if v5 else 3)
        except ssl.SSLCertVerificationError as exc:
            self._fail(
                "tls",
                f"TLS: the broker at {self._where()} presented an untrusted certificate: {_reason(exc)}",
            )
        except ssl.SSLError as exc:
            self._fail("tls", f"TLS handshake with the broker at {self._where()} failed: {_reason(exc)}")
        except socket.gaierror as exc:
            self._fail("unreachable", f"cannot resolve broker host {s.host!r}: {exc.strerror or exc}")
        except ConnectionRefusedError:
            self._fail("unreachable", f"broker at {self._where()} refused the TCP connection (not running?)")
        except TimeoutError:
            self._fail("unreachable", f"broker at {self._where()} unreachable: connection timed out")
        except OSError as exc:
            kind = "unreachable" if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH) else "lost"
            self._fail(kind, f"cannot connect to broker at {self._where()}: {_reason(exc)}")

    def _connected(
        self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Properties | None
    ) -> None:
        if client is not self._client:
            return
        if reason.is_failure:
            name = reason.getName()
            if name in ("Bad user name or password", "Not authorized"):
                who = f"user {self.settings.username!r}" if self.settings.username else "anonymous clients"
                self._fail("auth", f"broker at {self._where()} refused the credentials of {who}: {name}")
            else:
                self._fail("refused", f"broker at {self._where()} refused the connection: {name}")
            return
        if self._last_error:
            log.info("connected to MQTT broker at %s after %d failed attempt(s)", self._where(), self._attempt)
        else:
            log.info("connected to MQTT broker at %s", self._where())
        self.state = "up"
        self._attempt = 0
        self._last_error = ""
        self.error = ""
        self.error_kind = ""
        client.publish(self.will_topic, b"online", qos=1, retain=True)
        self._on_up()

    def _disconnected(
        self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Properties | None
    ) -> None:
        if client is not self._client or self.state in ("down", "closing"):
            return
        what = reason.getName() if isinstance(reason, ReasonCode) else str(reason)
        self._fail("lost", f"connection to broker at {self._where()} lost: {what}")

    def _published(
        self, client: paho.Client, userdata: Any, mid: int, reason: ReasonCode, props: Properties | None
    ) -> None:
        if client is not self._client:
            return
        failed = isinstance(reason, ReasonCode) and reason.is_failure
        self._on_ack(mid, not failed, reason.getName() if failed else "")

    def _fail(self, kind: str, message: str) -> None:
        was_up = self.state == "up"
        self._drop_client()
        self.state = "down"
        self.connect_errors += 0 if was_up else 1
        self.error = message
        self.error_kind = kind
        if message != self._last_error:
            log.warning("%s; retrying with backoff while samples are spooled", message)
        else:
            log.debug("%s (again)", message)
        self._last_error = message
        self._attempt += 1
        cap = self.settings.max_delay
        delay = min(cap, _FIRST_DELAY * 2 ** min(self._attempt - 1, 20))
        delay = random.uniform(delay / 2, delay) if not was_up else random.uniform(0, min(cap, _FIRST_DELAY))
        self._next_attempt = self._clock() + delay
        self._on_down(message)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.on_connect = client.on_disconnect = client.on_publish = None
            # paho closes its socket and wake-up socketpair only in __del__; do it now, so that a long
            # outage (one client per attempt) cannot pile up file descriptors.
            reset = getattr(client, "_reset_sockets", None)
            if reset is not None:
                try:
                    reset()
                except OSError:
                    pass
