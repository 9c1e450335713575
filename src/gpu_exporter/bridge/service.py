"""The bridge: MQTT batches in, remote write out, MQTT acknowledgement only after the write.

Two threads. paho's network thread receives messages and queues them (status messages update node
liveness directly). The writer thread takes what is queued (up to ``max_messages`` at a time), decodes,
drops replays, converts, writes, and only then acknowledges each message, in the order received. A
write that keeps failing blocks the writer; the broker holds everything unacknowledged meanwhile, and
MQTT 5's Receive Maximum stops it from sending more than ``receive_maximum`` unacknowledged messages.
If the bridge dies, every message it had not acknowledged is delivered again to its session.
"""

from __future__ import annotations

import itertools
import logging
import queue
import ssl
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge import columns, summaries
from gpu_exporter.bridge.clock import ClockGuard, Stamp, stamp_of
from gpu_exporter.bridge.columns import ColumnBatch
from gpu_exporter.bridge.convert import Converter
from gpu_exporter.bridge.dedup import SeqTracker
from gpu_exporter.bridge.metrics import BridgeMetrics, Liveness, NodeNames
from gpu_exporter.bridge.sender import RemoteWriter, Stopped
from gpu_exporter.forward import batch as codec

__all__ = ["Bridge", "BridgeSettings", "MessageHandler", "Received", "parse_mqtt_url"]

log = logging.getLogger(__name__)

MAX_NODES = 100_000  # distinct node names kept in per-node metrics and logs
# JSON text decoded per remote write (the decoded columns take about five times as much memory): past
# it, the messages taken at once are written in several groups, so that a burst of large payloads
# cannot multiply the bridge's memory by --bridge.max-messages. One payload is always taken whole.
GROUP_TEXT_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class BridgeSettings:
    mqtt_url: str
    remote_write_url: str
    topic_prefix: str = "gpu-exporter"
    mqtt_username: str = ""
    mqtt_password: str = ""
    mqtt_ca_file: str = ""
    mqtt_cert_file: str = ""
    mqtt_key_file: str = ""
    mqtt_insecure_skip_verify: bool = False
    group: str = ""  # shared subscription group; empty: a plain subscription
    client_id: str = "gpu-exporter-bridge"
    session_expiry: float = 86400.0
    receive_maximum: int = 200
    max_messages: int = 100  # messages per remote write
    linger: float = 0.0  # seconds the writer waits for more messages before a write (coalescing)
    max_payload: int = codec.DEFAULT_MAX_BYTES
    node_label: str = "node"
    rw_timeout: float = 10.0
    rw_username: str = ""
    rw_password: str = ""
    rw_bearer_token: str = ""
    rw_ca_file: str = ""
    rw_cert_file: str = ""
    rw_key_file: str = ""
    rw_insecure_skip_verify: bool = False
    rw_max_samples: int = 5000
    rw_backoff_max: float = 10.0
    rw_headers: tuple[tuple[str, str], ...] = ()
    dedup_streams: int = 100_000
    series_cache: int = 750_000
    max_series_per_node: int = 20_000
    max_clock_skew: float = 300.0
    clock_skew_policy: str = "correct"


def parse_mqtt_url(url: str) -> tuple[str, int, bool]:
    """(host, port, tls) of ``mqtt://host[:port]`` or ``mqtts://host[:port]`` (also tcp://, ssl://)."""
    parts = urllib.parse.urlsplit(url)
    tls = parts.scheme in ("mqtts", "ssl", "tls")
    if parts.scheme not in ("mqtt", "tcp", "mqtts", "ssl", "tls") or not parts.hostname:
        raise ValueError(f"invalid MQTT URL {url!r} (use mqtt://host:port or mqtts://host:port)")
    try:
        port = parts.port or (8883 if tls else 1883)
    except ValueError:
        raise ValueError(f"invalid port in MQTT URL {url!r}") from None
    return parts.hostname, port, tls


@dataclass(frozen=True, slots=True)
class Received:
    """A batch message as it came off the wire, waiting to be written and acknowledged."""

    mid: int
    qos: int
    topic: str
    payload: bytes
    stamp: Stamp | None = None  # when it arrived and, from MQTT 5 agents, when it was sent


class MessageHandler:
    """Decodes one message; a bad payload is counted per node and logged once per node, never raised."""

    def __init__(self, prefix: str, metrics: BridgeMetrics, max_payload: int, liveness: Liveness) -> None:
        self._prefix = prefix.rstrip("/") + "/"
        self._metrics = metrics
        self._max_payload = max_payload
        self._liveness = liveness
        self._logged: set[str] = set()
        self._lock = threading.Lock()

    def topic_node(self, topic: str) -> str:
        if topic.startswith(self._prefix):
            rest = topic[len(self._prefix) :]
            node, sep, _ = rest.rpartition("/")
            if sep and node:
                return node
        return "unknown"

    def decode(self, msg: Received) -> ColumnBatch | None:
        try:
            return self._decode(msg)
        except Exception as exc:  # the handler's promise: nothing escapes
            self.drop(self.topic_node(str(msg.topic)), "malformed", f"{type(exc).__name__}: {exc}")
            return None

    def _decode(self, msg: Received) -> ColumnBatch | None:
        node = self.topic_node(msg.topic)
        if len(msg.payload) > self._max_payload:
            self.drop(node, "oversized", f"payload of {len(msg.payload)} bytes exceeds {self._max_payload}")
            return None
        try:
            batch = columns.read(msg.payload, max_bytes=self._max_payload)
        except codec.PayloadError as exc:
            reason = "oversized" if "limit" in str(exc) else "malformed"
            self.drop(node, reason, str(exc))
            return None
        if batch.node != node:
            # The topic is what the broker's ACLs check: a node names itself only there.
            self.drop(node, "node_mismatch", f"payload names node {batch.node!r}, its topic {node!r}")
            return None
        self._liveness.seen(node)
        return summaries.complete(batch)  # a summary's gauges that held still: min = max = mean = last

    def drop(self, node: str, reason: str, why: str) -> None:
        """Count a dropped message for ``node``; log it the first time that node sends a bad one."""
        with self._lock:
            # The node comes from the topic: bound the label values a misbehaving publisher can create.
            first = node not in self._logged
            if first:
                if len(self._logged) >= MAX_NODES:
                    node, first = "_other", False
                else:
                    self._logged.add(node)
        self._metrics.payloads_dropped.labels(node, reason).inc()
        if first:
            log.warning(
                "dropped a %s batch from node %s: %s (logged once per node; see "
                "gpu_exporter_bridge_payloads_dropped_total)",
                reason,
                node,
                " ".join(why.split())[:300],
            )

    def status(self, topic: str, payload: bytes) -> None:
        """A retained status message: online or offline (plain text, or JSON with a "status" field)."""
        try:
            node = self.topic_node(topic)
            text = payload[:256].decode("utf-8", "replace").strip().lower()
            if not text:
                return
            if "offline" in text:
                self._liveness.status(node, False)
            elif "online" in text:
                self._liveness.status(node, True)
        except Exception:  # pragma: no cover - defensive, the network thread must go on
            log.debug("ignored a status message on %s", topic, exc_info=True)


class Bridge:
    """Subscriber, writer and acknowledger. ``start()`` then ``stop(timeout)``."""

    def __init__(self, settings: BridgeSettings, registry: CollectorRegistry) -> None:
        self.settings = settings
        self.metrics = BridgeMetrics(registry)
        self.liveness = Liveness()
        registry.register(self.liveness)
        self.dedup = SeqTracker(max_streams=settings.dedup_streams)
        self.handler = MessageHandler(settings.topic_prefix, self.metrics, settings.max_payload, self.liveness)
        self._stop = threading.Event()
        self._queue: queue.Queue[Received] = queue.Queue()
        self.nodes = NodeNames(MAX_NODES)
        self.clock = ClockGuard(settings.max_clock_skew, settings.clock_skew_policy, self.metrics, self.nodes)
        registry.register(self.clock)
        self._converter = Converter(
            settings.node_label,
            cache_size=settings.series_cache,
            max_series_per_node=settings.max_series_per_node,
        )
        self._writer = RemoteWriter(
            settings.remote_write_url,
            timeout=settings.rw_timeout,
            username=settings.rw_username,
            password=settings.rw_password,
            bearer_token=settings.rw_bearer_token,
            ca_file=settings.rw_ca_file,
            cert_file=settings.rw_cert_file,
            key_file=settings.rw_key_file,
            insecure_skip_verify=settings.rw_insecure_skip_verify,
            headers=dict(settings.rw_headers),
            max_samples=settings.rw_max_samples,
            backoff_max=settings.rw_backoff_max,
            metrics=self.metrics,
            stop=self._stop,
        )
        self._host, self._port, tls = parse_mqtt_url(settings.mqtt_url)
        prefix = settings.topic_prefix.rstrip("/")
        self.batch_topic = f"{prefix}/+/batch"
        if settings.group:
            self.batch_topic = f"$share/{settings.group}/{self.batch_topic}"
        self.status_topic = f"{prefix}/+/status"
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=settings.client_id, protocol=mqtt.MQTTv5)
        self._client.manual_ack_set(True)
        self._client.reconnect_delay_set(min_delay=1, max_delay=10)
        if settings.mqtt_username:
            self._client.username_pw_set(settings.mqtt_username, settings.mqtt_password or None)
        if tls:
            self._client.tls_set(
                ca_certs=settings.mqtt_ca_file or None,
                certfile=settings.mqtt_cert_file or None,
                keyfile=settings.mqtt_key_file or None,
                cert_reqs=ssl.CERT_NONE if settings.mqtt_insecure_skip_verify else ssl.CERT_REQUIRED,
            )
            if settings.mqtt_insecure_skip_verify:
                self._client.tls_insecure_set(True)
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_connect_fail = self._on_connect_fail
        self._last_fail_log = 0.0
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        self._thread = threading.Thread(target=self._run, name="bridge-writer", daemon=True)
        self._connected = threading.Event()
        self._unknown_logged: set[str] = set()
        self._limited_logged: set[str] = set()

    # ------------------------------------------------------------------------------------------- MQTT

    def start(self) -> None:
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = int(self.settings.session_expiry)
        props.ReceiveMaximum = self.settings.receive_maximum
        self._client.connect_async(self._host, self._port, keepalive=30, clean_start=False, properties=props)
        self._client.loop_start()
        self._thread.start()

    def wait_connected(self, timeout: float) -> bool:
        """True once connected and subscribed."""
        return self._connected.wait(timeout)

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        if rc.is_failure:
            log.warning("MQTT broker %s:%d refused the connection: %s", self._host, self._port, rc)
            return
        log.info(
            "connected to MQTT broker %s:%d (session present: %s)",
            self._host,
            self._port,
            getattr(flags, "session_present", "?"),
        )
        client.subscribe([(self.batch_topic, 1), (self.status_topic, 1)])
        self.metrics.connected.set(1)

    def _on_subscribe(self, client: mqtt.Client, userdata: Any, mid: int, rcs: list[ReasonCode], props: Any) -> None:
        failed = [str(rc) for rc in rcs if rc.is_failure]
        if failed:
            log.error("MQTT broker refused the subscription to %s: %s", self.batch_topic, ", ".join(failed))
            return
        if any(rc.value == 0 for rc in rcs):  # granted QoS 0: a broker limited to Maximum QoS 0
            log.error(
                "MQTT broker granted QoS 0 only for %s: a batch lost between broker and bridge is not resent "
                "(at-least-once needs QoS 1; Mosquitto: max_qos)",
                self.batch_topic,
            )
        self._connected.set()

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        now = time.monotonic()
        if now - self._last_fail_log >= 60.0:  # paho retries every few seconds: say it once a minute
            self._last_fail_log = now
            log.warning("cannot connect to MQTT broker %s:%d; retrying", self._host, self._port)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        self.metrics.connected.set(0)
        self._connected.clear()
        if not self._stop.is_set():
            log.warning("disconnected from MQTT broker %s:%d (%s); reconnecting", self._host, self._port, rc)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            topic = msg.topic
        except Exception:  # a topic that is not UTF-8
            topic = "?"
        if topic.endswith("/status"):
            self.handler.status(topic, bytes(msg.payload))
            if msg.qos:
                client.ack(msg.mid, msg.qos)
            return
        self.metrics.messages.inc()
        stamp = stamp_of(getattr(msg, "properties", None))
        self._queue.put(Received(msg.mid, msg.qos, topic, bytes(msg.payload), stamp))
        self.metrics.queue.inc()

    # ----------------------------------------------------------------------------------------- writer

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                first = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            msgs = [first]
            # Coalesce: wait up to --bridge.write-linger for more messages, so that a fleet whose
            # messages arrive one at a time is written in a few large requests instead of several
            # small ones per message. The first message's acknowledgement waits that much longer.
            deadline = time.monotonic() + self.settings.linger
            while len(msgs) < self.settings.max_messages:
                try:
                    msgs.append(self._queue.get_nowait())
                except queue.Empty:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stop.is_set():
                        break
                    try:
                        msgs.append(self._queue.get(timeout=left))
                    except queue.Empty:
                        break
            try:
                self.process_safely(msgs)
            except Stopped:
                log.info("stopping with %d messages unwritten; the broker delivers them again", len(msgs))
                return
            for m in msgs:
                if m.qos:
                    self._client.ack(m.mid, m.qos)
            self.metrics.queue.dec(len(msgs))

    def process_safely(self, msgs: list[Received]) -> int:
        """``process``, but a message that makes it fail (a bug, not a network error: those are retried
        inside the sender) is dropped and counted after a retry on its own, so it cannot block the
        stream or come back forever."""
        try:
            return self.process(msgs)
        except Stopped:
            raise
        except Exception:
            log.exception("unexpected error while writing %d messages; retrying them one by one", len(msgs))
        written = 0
        for m in msgs:
            try:
                written += self.process([m])
            except Stopped:
                raise
            except Exception as exc:
                self.handler.drop(self.handler.topic_node(m.topic), "error", f"{type(exc).__name__}: {exc}")
        return written

    def process(self, msgs: list[Received]) -> int:
        """Decode, drop replays, write. Returns the samples written; raises Stopped when stopping."""
        written = 0
        todo = iter(msgs)
        while True:
            group = self._group(todo)
            if group is None:
                return written
            written += group

    def _group(self, todo: Iterator[Received]) -> int | None:
        """Decode, check and write messages of ``todo`` until GROUP_TEXT_BYTES of JSON were decoded;
        the samples written, None when ``todo`` was empty."""
        decoded: list[tuple[ColumnBatch, list[int] | None]] = []
        pending: dict[tuple[str, str], set[int]] = {}  # seqs taken within this group of messages
        replays = 0
        text = 0
        now_ms = -(-time.time_ns() // 1_000_000)  # nothing later is written (bridge/clock.py); ceil: stamps round
        first = next(todo, None)
        if first is None:
            return None
        for m in itertools.chain((first,), todo):
            batch = self.handler.decode(m)
            if batch is None:
                continue
            stream = _stream(batch)
            taken = pending.setdefault((batch.node, stream), set())
            seqs = batch.seqs
            fresh = [i for i in self.dedup.unseen(batch.node, stream, seqs) if seqs[i] not in taken]
            replays += len(seqs) - len(fresh)
            if not fresh:
                continue
            checked = self.clock.check(
                batch, m.stamp or Stamp(now_ms), None if len(fresh) == len(seqs) else fresh, now_ms
            )
            if checked is None:
                continue
            batch, keep = checked
            taken.update(seqs[i] for i in (range(len(seqs)) if keep is None else keep))
            decoded.append((batch, keep))
            text += batch.text_bytes
            if text >= GROUP_TEXT_BYTES:
                break
        if replays:
            self.metrics.duplicates.inc(replays)
        if not decoded:
            return 0
        converted = self._converter.convert(decoded)
        for key in converted.unknown_keys:
            self._warn_unknown(key)
        for node, values in converted.limited.items():
            self._warn_limited(node, values)
        outcome = self._writer.write(converted.series)
        now = time.time()
        for batch, keep in decoded:
            self.dedup.mark(batch.node, _stream(batch), batch.seqs if keep is None else [batch.seqs[i] for i in keep])
        self.metrics.samples.inc(outcome.written)
        if outcome.written:  # health advances only with what remote storage accepted
            total = outcome.written + outcome.rejected
            self.metrics.gpu_samples.inc(round(converted.gpu_samples * outcome.written / total))
            self.metrics.last_write.set(now)
            if converted.newest_ms is not None:
                self.metrics.lag.set(max(0.0, now - converted.newest_ms / 1000))
        return outcome.written

    def _warn_limited(self, node: str, values: int) -> None:
        label = self.nodes.label(node)
        self.metrics.series_limited.labels(label).inc(values)
        if label not in self._limited_logged:
            self._limited_logged.add(label)
            log.warning(
                "node %s reached --bridge.max-series-per-node=%d distinct series; values of further series "
                "are dropped (logged once per node; see gpu_exporter_bridge_series_limited_total)",
                label,
                self.settings.max_series_per_node,
            )

    def _warn_unknown(self, key: str) -> None:
        if key not in self._unknown_logged:
            self._unknown_logged.add(key)
            log.warning(
                "metric key %r is not in this bridge's catalog; its values are skipped "
                "(is the exporter newer than the bridge?)",
                key,
            )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop writing (an unfinished write is abandoned, unacknowledged), then disconnect."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
            self._client.disconnect()
            self._client.loop_stop()
        self._writer.close()


def _stream(batch: ColumnBatch) -> str:
    """What repeats are told apart by, with the node: the boot, and for summaries a stream of their own
    (a summary point carries the sequence number of its window's last sample, which the raw sample
    still has to bring)."""
    return batch.boot + "/summary" if batch.summary_ms else batch.boot
