"""The broker connection: one paho-mqtt client per connection, driven by the forwarder's own thread.

Why a fresh client for every connection: paho keeps unacknowledged messages across reconnects and,
for a message published while offline, reports a failed ``MQTTMessageInfo`` yet still queues it. The
spool is our queue, so each connection starts empty, we publish only while connected, and an in-flight
window no larger than paho's ``max_inflight`` keeps paho from queueing at all.

Errors a user can cause (broker down, wrong password, untrusted certificate) end up as one log line
each time the error changes, and the same error at most once a minute; the agent keeps sampling and
spooling meanwhile. A connection that dies within ``STABLE`` seconds of its CONNACK (a broker that
disconnects at once, a flapping link) does not reset the reconnect backoff.

MQTT 5 limits announced in CONNACK are kept here (``max_packet``, ``receive_max``, ``retain_ok``, ...)
and obeyed: the forwarder sizes its packets and its in-flight window by them. The agent announces its
own Maximum Packet Size in CONNECT, so a broker may not send it anything larger.
"""

from __future__ import annotations

import errno
import logging
import math
import random
import select
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from gpu_exporter.mqtt import sendtime
from gpu_exporter.mqtt.client import new_client
from gpu_exporter.mqtt.packet import PacketGuard, publish_size
from gpu_exporter.mqtt.ramp import SegmentRamp, tcp_state
from gpu_exporter.mqtt.settings import LinkSettings, read_password
from gpu_exporter.mqtt.tls import error_reason as _reason

__all__ = ["Link"]

log = logging.getLogger("gpu_exporter.forward")

_FIRST_DELAY = 0.5  # seconds before the first retry; doubles up to the configured cap
# Seconds between attempts at most while no TCP connection comes up (refused, timed out, no route, no
# name): each costs the broker a SYN at most, and the link's return is seen within seconds, not at the
# end of a 30 s backoff. A broker that answered and refused, or dropped us soon after, backs off to the cap.
PROBE_EVERY = 5.0
STABLE = 10.0  # seconds a connection must last before a lost connection resets the backoff
_REPEAT = 60.0  # seconds before the same problem is logged again
RECEIVE_MAXIMUM = 65535  # MQTT 5's value when CONNACK says nothing
SESSION_TAKEN_OVER = 0x8E  # MQTT 5 DISCONNECT reason: another client connected with the same client id
_UNSPECIFIED = 0x80  # what paho reports for a connection the peer closed without a reason
_HOLD_POLL = 0.02  # seconds between looks at TCP's state while the ramp holds a write back (mqtt/ramp.py)


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
        self.error_kind = ""  # unreachable, refused, auth, tls, lost, protocol, qos
        self.connect_errors = 0
        self._up_at = -math.inf
        self._said: dict[str, float] = {}  # message -> when it was last logged
        # What the broker announced in its last CONNACK (MQTT 5; defaults are the protocol's)
        self.max_packet = 0  # Maximum Packet Size; 0: no limit announced
        self.receive_max = RECEIVE_MAXIMUM
        self.retain_ok = True
        self.max_qos = 2
        self.topic_alias_max = 0  # the agent never uses topic aliases, so any value is obeyed
        self._status_mid: int | None = None  # the status message while its PUBACK is due
        self.status_rtt = 0.0  # seconds from connecting to the status message's PUBACK (0: not yet)
        self.refused_publish = ""  # reason of the last publish the client refused ("" when none)
        self.pace_cap = 0  # largest packet the link carries within the keepalive (forward/link_meter.py); 0: none
        self._guard: PacketGuard | None = None  # the socket paho reads from, bounded (see PacketGuard)
        # how the last connection ended, for twins.TwinWatch: (reason code, from a broker DISCONNECT, seconds up)
        self.last_loss: tuple[int | None, bool, float] | None = None

    @property
    def up(self) -> bool:
        return self.state == "up"

    # ------------------------------------------------------------------------------------- driving

    def step(self, timeout: float) -> None:
        """Do what is due: a connection attempt, network I/O for up to ``timeout`` seconds."""
        now = self._clock()
        if self.state == "up" and self._attempt and now - self._up_at >= STABLE:
            self._attempt = 0  # the connection held: the next loss starts the backoff afresh
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
        rc = self._loop(client, timeout)
        if rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS,) and self._client is client and self.state != "down":
            self._lost(paho.error_string(rc))

    def _loop(self, client: paho.Client, timeout: float) -> MQTTErrorCode:
        """paho's loop, but while the guard holds a write back (a young connection's piece not yet
        acknowledged by TCP, mqtt/ramp.py) it waits for the socket to be readable only, looking at TCP's
        state every ``_HOLD_POLL`` seconds, and writes as soon as the piece is acknowledged: paho's own
        loop would find the socket writable at once, and spin."""
        guard = self._guard
        if guard is None or not client.want_write() or not guard.holding():
            return client.loop(timeout=timeout)
        for _ in range(max(1, math.ceil(timeout / _HOLD_POLL))):
            pending = getattr(guard, "pending", None)  # TLS: bytes already decrypted
            readable = (callable(pending) and pending() > 0) or select.select([guard], [], [], _HOLD_POLL)[0]
            if readable:
                rc = client.loop_read()
                if rc != MQTTErrorCode.MQTT_ERR_SUCCESS or self._client is not client:
                    return rc
            if not guard.holding():
                rc = client.loop_write()
                if rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    return rc
                break
            if readable:
                break
        return client.loop_misc()

    def wait_hint(self) -> float:
        """Seconds until the next connection attempt (0 when not waiting for one)."""
        if self.state != "down":
            return 0.0
        return max(0.0, self._next_attempt - self._clock())

    @property
    def v5(self) -> bool:
        return self.settings.protocol == "5"

    def capacity(self) -> int:
        """Batches that may be in flight now: our window within the broker's Receive Maximum, less the
        status message while its PUBACK is due (it has a slot of its own in paho's window)."""
        return max(0, min(self.settings.window, self.receive_max - (self._status_mid is not None)))

    def tcp_rto(self) -> float:
        """TCP's retransmission timeout on the connection now, in seconds (Linux ``TCP_INFO``); 0 when not
        known. The link meter keeps what is in flight within it (forward/link_meter.py, "Pacing")."""
        guard = self._guard
        if guard is None or self.state != "up":
            return 0.0
        st = tcp_state(guard)
        return st.rto if st is not None else 0.0

    def ramp_quick(self) -> bool:
        """Whether the connection is young and everything on it came back quickly so far (mqtt/ramp.py):
        a PUBACK now says nothing of the link's capacity."""
        guard = self._guard
        ramp = guard.ramp if guard is not None else None
        return ramp is not None and ramp.quick()

    def packet_limit(self) -> int:
        """The largest PUBLISH to send now: the broker's Maximum Packet Size, within what the link carries
        within the keepalive (``pace_cap``); 0 when neither is known."""
        limits = [n for n in (self.max_packet, self.pace_cap) if n]
        return min(limits) if limits else 0

    def packet_size(self, topic: str, payload: int) -> int:
        return publish_size(topic, payload, self.v5)

    def fits(self, topic: str, payload: int) -> bool:
        """Whether a PUBLISH of ``payload`` bytes to ``topic`` is within ``packet_limit()``."""
        limit = self.packet_limit()
        return not limit or publish_size(topic, payload, self.v5) <= limit

    def abort(self, kind: str, message: str) -> None:
        """Give the connection up (a broker that stopped acknowledging): a fresh one after the usual backoff."""
        if self.state != "down":
            self._fail(kind, message)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> int | None:
        """Publish at QoS 1; the message id, or None when the client refused (``refused_publish`` says why)."""
        client = self._client
        self.refused_publish = ""
        if client is None or self.state != "up":
            self.refused_publish = "not connected"
            return None
        # MQTT 5: stamped with the send time here, at publish (mqtt/sendtime.py)
        props = sendtime.properties() if self.v5 else None
        info = client.publish(topic, payload, qos=1, retain=retain and self.retain_ok, properties=props)
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self.refused_publish = "queue full" if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE else "refused"
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
                client.publish(self.will_topic, status, qos=1, retain=self.retain_ok)
            client.disconnect()
            deadline = self._clock() + flush
            while self._client is client and self._clock() < deadline:
                if self._loop(client, 0.05) != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    break
        self._drop_client()
        self.state = "down"

    # ------------------------------------------------------------------------------------- internals

    def _where(self) -> str:
        return f"{self.settings.host}:{self.settings.port}"

    def _connect(self) -> None:
        s = self.settings
        v5 = s.protocol == "5"
        password = None
        if s.username:
            try:
                password = read_password(s)
            except OSError as exc:
                self._fail("auth", f"cannot read --mqtt.password-file={s.password_file}: {_reason(exc)}")
                return
        client = new_client(s, password, reconnect_on_failure=False)
        client.max_inflight_messages_set(s.window + 1)  # + the status message: it takes no batch's slot
        client.max_queued_messages_set(s.window + 1)
        client.connect_timeout = 5.0
        client.will_set(self.will_topic, b"offline", qos=1, retain=self.retain_ok)
        client.on_connect = self._connected
        client.on_disconnect = self._disconnected
        client.on_publish = self._published
        self._client = client
        self.state = "connecting"
        self._connect_deadline = self._clock() + 15.0
        props = None
        if v5:
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.MaximumPacketSize = s.max_incoming
        try:
            client.connect(s.host, s.port, keepalive=s.keepalive, clean_start=True if v5 else 3, properties=props)
            sock = getattr(client, "_sock", None)  # paho's socket, read through the guard from now on
            if sock is not None:
                ramp = SegmentRamp(lambda: tcp_state(sock)) if isinstance(sock, socket.socket) else None
                self._guard = PacketGuard(sock, s.max_incoming, ramp)
                client._sock = self._guard
        except ssl.SSLCertVerificationError as exc:
            self._fail(
                "tls",
                f"TLS: the broker at {self._where()} presented an untrusted certificate: {_reason(exc)}",
            )
        except ssl.SSLError as exc:
            self._fail("tls", f"TLS handshake with the broker at {self._where()} failed: {_reason(exc)}")
        except socket.gaierror as exc:
            self._fail("unreachable", f"cannot resolve broker host {s.host!r}: {exc.strerror or exc}", probe=True)
        except ConnectionRefusedError:
            message = f"broker at {self._where()} refused the TCP connection (not running?)"
            self._fail("unreachable", message, probe=True)
        except TimeoutError:
            self._fail("unreachable", f"broker at {self._where()} unreachable: connection timed out", probe=True)
        except OSError as exc:
            kind = "unreachable" if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH) else "lost"
            self._fail(
                kind, f"cannot connect to broker at {self._where()}: {_reason(exc)}", probe=kind == "unreachable"
            )

    def _connected(
        self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Properties | None
    ) -> None:
        if client is not self._client:
            return
        if reason.is_failure:
            name = reason.getName()
            if name == "Retain not supported" and self.retain_ok:
                # Our last will is retained; a broker without retained messages refuses such a CONNECT.
                log.warning(
                    "broker at %s has no retained messages; the status message will not be retained", self._where()
                )
                self.retain_ok = False
                self._drop_client()
                self.state = "down"
                self._next_attempt = self._clock()
                return
            if name == "QoS not supported":  # our last will is QoS 1: a broker of QoS 0 only refuses it
                self.max_qos = 0
                self._qos_zero()
                return
            if name in ("Bad user name or password", "Not authorized"):
                who = f"user {self.settings.username!r}" if self.settings.username else "anonymous clients"
                self._fail("auth", f"broker at {self._where()} refused the credentials of {who}: {name}")
            else:
                self._fail("refused", f"broker at {self._where()} refused the connection: {name}")
            return
        self._limits(props)
        if self.max_qos < 1:
            self._qos_zero()
            return
        if self._last_error:  # a reconnect: said once a minute at most, however often the link flaps
            after = f" after {self._attempt} failed attempt(s)" if self._attempt else ""
            self._say("connected", f"connected to MQTT broker at {self._where()}{after}", logging.INFO)
        else:
            log.info("connected to MQTT broker at %s", self._where())
        self.state = "up"
        self._up_at = self._clock()
        self.error = ""
        self.error_kind = ""
        info = client.publish(self.will_topic, b"online", qos=1, retain=self.retain_ok)
        self._status_mid = int(info.mid) if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS else None
        self._on_up()

    def _qos_zero(self) -> None:
        self._fail(
            "qos",
            f"broker at {self._where()} accepts QoS 0 only (Maximum QoS 0): at-least-once delivery is "
            "impossible, so nothing is forwarded and samples stay in the spool; allow QoS 1 for this client "
            "on the broker (Mosquitto: max_qos)",
        )

    def _limits(self, props: Properties | None) -> None:
        """Keep what an MQTT 5 CONNACK announces (absent properties mean the protocol's defaults)."""

        def get(name: str, default: int) -> int:
            value = getattr(props, name, None) if props is not None else None
            return int(value) if value is not None else default

        before = (self.max_packet, self.receive_max, self.retain_ok, self.max_qos)
        self.max_packet = get("MaximumPacketSize", 0)
        self.receive_max = max(1, get("ReceiveMaximum", RECEIVE_MAXIMUM))
        self.retain_ok = self.retain_ok and bool(get("RetainAvailable", 1))
        self.max_qos = get("MaximumQoS", 2)
        self.topic_alias_max = get("TopicAliasMaximum", 0)
        if (self.max_packet, self.receive_max, self.retain_ok, self.max_qos) != before:
            log.info(
                "broker at %s limits: Maximum Packet Size %s, Receive Maximum %d, Maximum QoS %d, retain %s",
                self._where(),
                self.max_packet or "none",
                self.receive_max,
                self.max_qos,
                "available" if self.retain_ok else "not available",
            )

    def _disconnected(
        self, client: paho.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Properties | None
    ) -> None:
        if client is not self._client or self.state in ("down", "closing"):
            return
        code = reason.value if isinstance(reason, ReasonCode) else None
        from_broker = bool(getattr(flags, "is_disconnect_packet_from_server", False))
        self.last_loss = (code, from_broker, self._clock() - self._up_at)  # for twins.TwinWatch
        if code == SESSION_TAKEN_OVER:
            self._fail(
                "lost",
                f"broker at {self._where()} disconnected the agent: session taken over, another client "
                f"connected with the client id {self.settings.client_id!r} (a second agent with the same "
                "--node-name or --mqtt.client-id?)",
            )
            return
        if not from_broker and code == _UNSPECIFIED and self.state == "up":
            # paho calls a connection closed without a DISCONNECT "Unspecified error" (its own closes, such
            # as a keepalive that expired, have names of their own and keep them). Mosquitto before
            # 2.0.15 closes an agent's connection so when another client connects with the same client id.
            self._lost(
                f"closed without a DISCONNECT (the network, a broker restart, or another client connecting "
                f"with the client id {self.settings.client_id!r})"
            )
            return
        self._lost(reason.getName() if isinstance(reason, ReasonCode) else str(reason))

    def _lost(self, what: str) -> None:
        guard = self._guard
        if guard is not None and guard.violation:
            self._fail(
                "protocol",
                f"broker at {self._where()} sends a packet of {guard.violation} bytes, over the "
                f"{guard.limit} the agent announced as its Maximum Packet Size; connection closed before "
                "reading it",
            )
        else:
            self._fail("lost", f"connection to broker at {self._where()} lost: {what}")

    def _published(
        self, client: paho.Client, userdata: Any, mid: int, reason: ReasonCode, props: Properties | None
    ) -> None:
        if client is not self._client:
            return
        if mid == self._status_mid:
            self._status_mid = None
            self.status_rtt = self._clock() - self._up_at  # the link's latency: nothing went before it
            return
        failed = isinstance(reason, ReasonCode) and reason.is_failure
        self._on_ack(mid, not failed, reason.getName() if failed else "")

    def _say(self, key: str, message: str, level: int = logging.WARNING) -> None:
        """Log ``message`` unless the same ``key`` was logged less than a minute ago (then at debug)."""
        now = self._clock()
        if now - self._said.get(key, -math.inf) >= _REPEAT:
            self._said[key] = now
            log.log(level, "%s", message)
        else:
            log.debug("%s (again)", message)

    def _fail(self, kind: str, message: str, probe: bool = False) -> None:
        """The connection is down; the next attempt after a backoff. ``probe``: no TCP connection came up
        (nothing answered), so attempts go every ``PROBE_EVERY`` seconds at most (jittered)."""
        was_up = self.state == "up"
        now = self._clock()
        self._drop_client()
        self.state = "down"
        self._status_mid = None
        self.connect_errors += 0 if was_up else 1
        self.error = message
        self.error_kind = kind
        self._say(message, f"{message}; retrying with backoff while samples are spooled")
        self._last_error = message
        stable = was_up and now - self._up_at >= STABLE
        self._attempt = 0 if stable else self._attempt + 1
        cap = self.settings.max_delay
        if stable:  # a connection that held: reconnect at once (with a little jitter)
            delay = random.uniform(0, min(cap, _FIRST_DELAY))
        else:  # nothing yet, or a connection that died soon after CONNACK: back off, doubling
            delay = min(cap, _FIRST_DELAY * 2 ** min(self._attempt - 1, 20))
            if probe:  # a SYN or a name lookup: cheap to try again soon (the link may be back)
                delay = min(delay, PROBE_EVERY)
            delay = random.uniform(delay / 2, delay)
        if kind == "qos":
            delay = cap  # a broker setting: it will not change in a second
        self._next_attempt = now + delay
        self._on_down(message)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        guard, self._guard = self._guard, None
        if guard is not None and self.state != "closing":
            # Given up, not closed: what waits in the socket's send buffer would still go out on the link
            # (minutes of a thin one) ahead of the next connection's handshake. Reset instead.
            try:
                guard.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
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
