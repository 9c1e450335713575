"""A real Mosquitto for tests, and a subscriber that collects decoded batches.

Usage from a test module::

    from .mosquitto import Broker, Collector, broker_fixture  # noqa: F401  (provides the broker fixture)

The broker listens on 127.0.0.1 on a free port with its own config and persistence directory under
the test's tmp_path, and is stopped by PID. ``stop()`` / ``start()`` simulate an outage on the same
port; persistence keeps the collector's session (and the messages queued for it) across the restart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from gpu_exporter.payload import Batch, PayloadError, decode

from .ports import free_port, listens_on
from .procs import stop_process
from .tls import make_tls
from .waits import wait_until

__all__ = ["Broker", "Collector", "broker_fixture", "make_tls", "wait_until"]

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


class Broker:
    def __init__(
        self,
        workdir: Path,
        users: dict[str, str] | None = None,
        tls: dict[str, str] | None = None,
        extra: str = "",
    ) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        lines = [
            f"listener {self.port} 127.0.0.1",
            "persistence true",
            f"persistence_location {self.dir}/",
            "max_queued_messages 0",
            "max_inflight_messages 0",
            f"log_dest file {self.dir}/mosquitto.log",
            "log_type error",
            "log_type warning",
            "log_type notice",
            "log_type information",
            "connection_messages true",
        ]
        if os.geteuid() == 0:
            lines.append("user root")  # else mosquitto drops to its own user and cannot read tmp_path
        if users:
            pw = self.dir / "passwd"
            pw.write_text("")
            for user, password in users.items():
                subprocess.run([MOSQUITTO_PASSWD, "-b", str(pw), user, password], check=True)
            lines += ["allow_anonymous false", f"password_file {pw}"]
        else:
            lines.append("allow_anonymous true")
        if tls:
            lines += [f"cafile {tls['ca']}", f"certfile {tls['cert']}", f"keyfile {tls['key']}"]
            if tls.get("require_certificate"):
                lines.append("require_certificate true")
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text("\n".join(lines) + "\n" + extra)

    @property
    def url(self) -> str:
        return f"{'mqtts' if self.tls else 'mqtt'}://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self.proc is None
        self.proc = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        if not wait_until(self._listening, 10):
            self.stop()
            raise RuntimeError(f"mosquitto did not start; log:\n{self.log()}")

    def _listening(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited with {self.proc.returncode}:\n{self.log()}")
        assert self.proc is not None
        return listens_on(self.proc.pid, self.port)  # its own socket: the port may be another test's too

    def stop(self) -> None:
        """SIGTERM by PID (Mosquitto saves its persistence file), SIGKILL if it lingers."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_process(proc)
        if proc.stderr is not None:
            proc.stderr.close()

    def log(self) -> str:
        path = self.dir / "mosquitto.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(name="broker")
def broker_fixture(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "mosquitto")
    b.start()
    try:
        yield b
    finally:
        b.stop()


class Collector:
    """Subscribes to ``<prefix>/+/batch`` with a persistent session and keeps every decoded batch.

    The session survives broker restarts (clean_start False, long expiry, broker persistence), so what
    the exporter publishes while the collector is reconnecting is delivered afterwards.
    """

    def __init__(
        self,
        broker: Broker,
        prefix: str = "gpu-exporter",
        reconnect_delay: tuple[float, float] = (0.1, 0.5),
        **client_args: Any,
    ) -> None:
        self.broker = broker
        self.batches: list[Batch] = []
        self.raw: list[bytes] = []
        self.errors: list[str] = []
        self.status: dict[str, bytes] = {}
        self.health: list[Batch] = []  # health reports (payload/health.py), kept apart from the batches
        self.order: list[tuple[str, int, int]] = []  # (boot, first_seq, last_seq) in arrival order
        self._lock = threading.Lock()
        self.topic = f"{prefix}/+/batch"
        self.status_topic = f"{prefix}/+/status"
        self.client = paho.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=f"collector-{uuid.uuid4().hex[:8]}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self.client.reconnect_delay_set(*reconnect_delay)
        if client_args.get("username"):
            self.client.username_pw_set(client_args["username"], client_args.get("password"))
        if client_args.get("tls_ca"):
            self.client.tls_set(
                ca_certs=client_args["tls_ca"], certfile=client_args.get("tls_cert"), keyfile=client_args.get("tls_key")
            )
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.connected = threading.Event()
        self.subscribed = threading.Event()

    def __enter__(self) -> Collector:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", self.broker.port, keepalive=10, clean_start=False, properties=props)
        self.client.loop_start()
        assert self.connected.wait(10), "collector could not connect"
        # Only a SUBACK says the broker holds the subscription: a test that stops the broker right away
        # must not leave it a session without one (restored as "present", so never subscribed again).
        assert self.subscribed.wait(10), "collector could not subscribe"
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.loop_stop()
        with contextlib.suppress(Exception):
            self.client.disconnect()

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        if flags.session_present:
            self.subscribed.set()
        else:
            client.subscribe([(self.topic, 1), (self.status_topic, 1)])
        self.connected.set()

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reasons: Any, props: Any) -> None:
        if all(not r.is_failure for r in reasons):
            self.subscribed.set()

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        if msg.topic.endswith("/status"):
            with self._lock:
                self.status[msg.topic] = msg.payload
            return
        try:
            batch = decode(msg.payload)
        except PayloadError as exc:
            with self._lock:
                self.errors.append(str(exc))
            return
        with self._lock:
            if batch.health:  # a health report: the agent's own metrics, no samples
                self.health.append(batch)
                return
            self.raw.append(msg.payload)
            self.batches.append(batch)
            self.order.append((batch.boot, batch.first_seq, batch.last_seq))

    def seqs(self, boot: str | None = None) -> dict[str, set[int]]:
        """Sequence numbers received, per boot (or for one boot)."""
        out: dict[str, set[int]] = {}
        with self._lock:
            for b in self.batches:
                if (boot is None or b.boot == boot) and not b.summary_ms:  # summaries: not samples
                    out.setdefault(b.boot, set()).update(s.seq for s in b.samples)
        return out

    def count(self) -> int:
        with self._lock:
            return sum(len(b.samples) for b in self.batches if not b.summary_ms)

    def caught_up(self, boot: str, acknowledged: float) -> bool:
        """True once this subscriber holds at least ``acknowledged`` distinct samples of ``boot``.

        A PUBACK means the broker has a batch, not that it reached us: after an outage the broker may
        still be sending what it queued for this session (the newest batch first, so the highest
        sequence number says nothing). Wait on this, with the exporter's own published count, before
        comparing what arrived with what was sent.
        """
        return len(self.seqs(boot).get(boot, ())) >= acknowledged
