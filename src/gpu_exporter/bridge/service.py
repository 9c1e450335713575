"""The bridge: MQTT batches in, remote write out, MQTT acknowledgement only after the write.

Two threads. paho's network thread receives messages and queues them (status messages update node
liveness directly; a payload over --bridge.max-payload is dropped there, before it is queued). The
writer thread takes what is queued (up to ``max_messages`` at a time, waiting up to ``linger`` after the
first for more, so that a fleet's messages arriving one at a time make few large writes), decodes, drops
replays, converts, writes, and only then acknowledges the messages of that write, in the order received. A write that keeps failing
blocks the writer; the broker holds everything unacknowledged meanwhile. What the bridge holds is
bounded in messages and bytes by its own account (``inflight.py``): at the bound paho's thread waits,
reads nothing more, and the broker keeps the rest. MQTT 5's Receive Maximum and Maximum Packet Size,
announced in CONNECT, ask the broker for the same; the bridge does not rely on it.
If the bridge dies, every message it had not acknowledged is delivered again to its session; with a
``state_dir`` the restarted bridge recognises those it had written (``journal.py``).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.reasoncodes import ReasonCode
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.admission import HOLD, WRITE, Admission
from gpu_exporter.bridge.clock import ClockGuard, Stamp, stamp_of
from gpu_exporter.bridge.convert import Converter
from gpu_exporter.bridge.dedup import SeqTracker
from gpu_exporter.bridge.inflight import Inflight
from gpu_exporter.bridge.journal import WriteJournal, seq_ranges
from gpu_exporter.bridge.limits import NewNodes, SeriesBudget
from gpu_exporter.bridge.messages import MAX_NODES, MessageHandler, Received
from gpu_exporter.bridge.metrics import BridgeMetrics, Liveness
from gpu_exporter.bridge.refusals import Refusals
from gpu_exporter.bridge.sender import RemoteWriter, Stopped
from gpu_exporter.bridge.session import Session
from gpu_exporter.bridge.settings import BridgeSettings, connect_properties, link_settings, new_nodes_burst
from gpu_exporter.bridge.twins import Twins
from gpu_exporter.mqtt.client import new_client, reread_password_on_reconnect
from gpu_exporter.payload.columns import ColumnBatch

__all__ = ["Bridge", "MessageHandler", "Received"]

log = logging.getLogger(__name__)

# JSON text decoded per remote write (the decoded columns take about five times as much memory): past
# it, the messages taken at once are written in several groups, so that a burst of large payloads
# cannot multiply the bridge's memory by --bridge.max-messages. One payload is always taken whole.
GROUP_TEXT_BYTES = 4 * 1024 * 1024


class Bridge:
    """Subscriber, writer and acknowledger. ``start()`` then ``stop(timeout)``."""

    def __init__(
        self, settings: BridgeSettings, registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``clock`` (monotonic seconds) times the series window, the new-name rate, twin liveness and
        the MQTT side of readiness."""
        self.settings = settings
        self.metrics = BridgeMetrics(registry)
        self.liveness = Liveness()
        registry.register(self.liveness)
        self.dedup = SeqTracker(max_streams=settings.dedup_streams)
        self.journal = self._load_journal()
        self.handler = MessageHandler(settings.topic_prefix, self.metrics, settings.max_payload, self.liveness)
        self._stop = threading.Event()
        # bounded by ``inflight``: paho's thread waits there before it puts a message here
        self._queue: queue.Queue[Received] = queue.Queue()
        self.inflight = Inflight(settings.receive_maximum, settings.max_inflight_bytes, self._stop)
        self.metrics.queue_bytes.set_function(lambda: self.inflight.usage()[1])
        self.nodes = self.handler.nodes
        self.log = self.handler.log
        self.new_nodes = NewNodes(settings.new_nodes_per_minute, clock, burst=new_nodes_burst(settings))
        # what waits for admission takes at most half of the in-flight account: the rest keeps flowing
        self.admission = Admission(
            self.new_nodes, settings.receive_maximum // 2, settings.max_inflight_bytes // 2, clock
        )
        self.metrics.watch_admission(self.admission.usage, self.admission.oldest_wait)
        self.twins = Twins(MAX_NODES, clock)
        self.clock = ClockGuard(settings.max_clock_skew, settings.clock_skew_policy, self.metrics, self.nodes)
        registry.register(self.clock)
        self._converter = Converter(
            settings.node_label,
            cache_size=settings.series_cache,
            budget=SeriesBudget(settings.max_series_per_node, settings.max_series, clock=clock),
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
        self.link = link_settings(settings)  # ConfigError when a TLS file does not load
        self._host, self._port = self.link.host, self.link.port
        where = f"{self._host}:{self._port}"
        self.session = Session(where, settings.client_id, self.metrics.takeovers, self.log, clock)
        prefix = settings.topic_prefix.rstrip("/")
        self.batch_topic = f"{prefix}/+/batch"
        if settings.group:
            self.batch_topic = f"$share/{settings.group}/{self.batch_topic}"
        self.status_topic = f"{prefix}/+/status"
        self._client = new_client(self.link, settings.mqtt_password)
        reread_password_on_reconnect(self._client, self.link)  # a rotated password file, from the next connection
        self._client.manual_ack_set(True)  # a message is acknowledged after its write
        self._client.reconnect_delay_set(min_delay=1, max_delay=round(self.link.max_delay))
        self._client.on_connect = self._on_connect
        self._client.on_disconnect = self._on_disconnect
        self._client.on_connect_fail = self._on_connect_fail
        self._last_fail_log = 0.0
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        self._thread = threading.Thread(target=self._run, name="bridge-writer", daemon=True)
        self._connected = threading.Event()
        self._refusals = Refusals(settings, self.metrics, self.nodes, self.log)

    def _load_journal(self) -> WriteJournal | None:
        """The record of what this bridge's session had written, read into the replay memory."""
        if not self.settings.state_dir:
            return None
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.settings.client_id)
        journal = WriteJournal(Path(self.settings.state_dir) / f"written-{name}.log")
        loaded = journal.load(self.dedup)
        try:
            journal.open()
        except OSError as exc:
            raise OSError(f"--bridge.state-dir: cannot write {journal.path}: {exc.strerror or exc}") from None
        if loaded:
            log.info("recognising %d ranges of sequence numbers written before the restart (%s)", loaded, journal.path)
        return journal

    # ------------------------------------------------------------------------------------------- MQTT

    def start(self) -> None:
        props = connect_properties(self.settings)  # a session that outlives a disconnection
        self._client.connect_async(self._host, self._port, self.link.keepalive, clean_start=False, properties=props)
        self._client.loop_start()
        self._thread.start()

    def ready(self) -> tuple[bool, str]:
        """/readyz: not ready while the broker has been unreachable, or remote writes have failed, for
        --bridge.readiness-timeout (and until first subscribed)."""
        why = self.session.unready(self.settings.readiness_timeout)
        if why is None:
            failing = self._writer.failing_for()
            if failing is not None and failing >= self.settings.readiness_timeout:
                why = f"remote writes to {self._writer.url} failing for {failing:.0f}s ({self._writer.last_failure})"
        return (False, why) if why else (True, "ready")

    def wait_connected(self, timeout: float) -> bool:
        """True once connected and subscribed."""
        return self._connected.wait(timeout)

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        if rc.is_failure:
            if not self.session.refused(rc.value, str(rc)):
                log.warning("MQTT broker %s:%d refused the connection: %s", self._host, self._port, rc)
            return
        self.session.connected()
        log.info(
            "connected to MQTT broker %s:%d (session present: %s)",
            self._host,
            self._port,
            getattr(flags, "session_present", "?"),
        )
        client.subscribe([(self.batch_topic, 1), (self.status_topic, 1)])

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
        self.new_nodes.subscribed()
        self.session.subscribed()
        # Connected means receiving: before the SUBACK, a batch published now reaches no session of
        # the bridge's (on its first connection there is none yet), so the gauge waits for it too.
        self.metrics.connected.set(1)
        self._connected.set()

    def _on_connect_fail(self, client: mqtt.Client, userdata: Any) -> None:
        self.session.failed("cannot connect")
        now = time.monotonic()
        if now - self._last_fail_log >= 60.0:  # paho retries every few seconds: say it once a minute
            self._last_fail_log = now
            log.warning("cannot connect to MQTT broker %s:%d; retrying", self._host, self._port)

    def _on_disconnect(self, client: mqtt.Client, userdata: Any, flags: Any, rc: ReasonCode, props: Any) -> None:
        self.metrics.connected.set(0)
        self._connected.clear()
        if self._stop.is_set():
            return
        code = rc.value if isinstance(rc, ReasonCode) else None
        from_broker = bool(getattr(flags, "is_disconnect_packet_from_server", False))
        if not self.session.lost(code, from_broker, str(rc)):  # a takeover is logged there
            log.warning("disconnected from MQTT broker %s:%d (%s); reconnecting", self._host, self._port, rc)

    def _on_message(self, client: mqtt.Client, userdata: Any, msg: mqtt.MQTTMessage) -> None:
        try:
            self._receive(client, msg)
        except Exception as exc:  # paho's thread must go on (an exception would end its loop)
            self.log.warning("receive", "unexpected error on a received message: %s: %s", type(exc).__name__, exc)

    def _receive(self, client: mqtt.Client, msg: mqtt.MQTTMessage) -> None:
        try:
            topic = msg.topic
        except Exception:  # a topic that is not UTF-8
            topic = "?"
        if topic.endswith("/status"):
            self.status(topic, bytes(msg.payload))
            if msg.qos:
                client.ack(msg.mid, msg.qos)
            return
        self.metrics.messages.inc()
        payload = msg.payload
        if len(payload) > self.settings.max_payload:  # before it takes room in the queue
            self.handler.drop(
                self.handler.topic_node(topic),
                "oversized",
                f"payload of {len(payload)} bytes exceeds the {self.settings.max_payload}-byte limit",
            )
            if msg.qos:
                client.ack(msg.mid, msg.qos)
            return
        stamp = stamp_of(getattr(msg, "properties", None), unseen=self.inflight.unseen())
        received = Received(msg.mid, msg.qos, topic, bytes(payload), stamp, not self.new_nodes.has_subscribed())
        waited = self.inflight.waited
        admitted = self.inflight.admit(received, bool(msg.dup))
        if self.inflight.waited > waited:
            self.metrics.inflight_wait.inc(self.inflight.waited - waited)
        if not admitted:
            if not self._stop.is_set():
                self.metrics.redeliveries.inc()
            return
        self._queue.put(received)
        self.metrics.queue.inc()

    def status(self, topic: str, payload: bytes) -> None:
        """A node's status message: its liveness, and while the fleet introduces itself, its name."""
        self.handler.status(topic, payload)
        self.new_nodes.status(self.handler.topic_node(topic))

    # ----------------------------------------------------------------------------------------- writer

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = self.admission.due()  # held back, their names admitted now: they go first
            if not msgs:
                try:
                    first = self._queue.get(timeout=0.2)
                except queue.Empty:
                    continue
                msgs = self._take(first)
            try:
                self.process_safely(msgs)
            except Stopped:
                log.info("stopping with %d messages unwritten; the broker delivers them again", len(msgs))
                self.inflight.release(msgs)
                return
            done = [m for m in msgs if not self.admission.holds(m)]  # what waits stays held, unacknowledged
            for m in self.inflight.claim(done):  # acknowledged before released: paho sends them on
                self._client.ack(m.mid, m.qos)
            self.inflight.release(done)
            self.metrics.queue.dec(len(done))

    def process_due(self) -> int:
        """Write the held-back messages whose names are admitted now (the writer does so in its loop)."""
        due = self.admission.due()
        return self.process_safely(due) if due else 0

    def _take(self, first: Received) -> list[Received]:
        """``first`` and what else is queued, up to ``max_messages``, waiting at most ``linger`` seconds
        after ``first`` for more: a write's latency bound."""
        msgs = [first]
        deadline = time.monotonic() + self.settings.linger
        while len(msgs) < self.settings.max_messages:
            try:
                msgs.append(self._queue.get_nowait())
                continue
            except queue.Empty:
                pass
            left = deadline - time.monotonic()
            if left <= 0 or self._stop.is_set():
                break
            try:
                msgs.append(self._queue.get(timeout=min(left, 0.2)))
            except queue.Empty:
                continue
        return msgs

    def _acknowledge(self, msgs: list[Received]) -> None:
        """Acknowledge ``msgs`` (each once), as soon as what they carry was written; not those held back."""
        for m in self.inflight.claim(m for m in msgs if not self.admission.holds(m)):
            self._client.ack(m.mid, m.qos)

    def _record(self, decoded: list[tuple[ColumnBatch, list[int] | None]]) -> None:
        """Record a write's sequence numbers (``journal.py``), before its messages are acknowledged."""
        if self.journal is None:
            return
        marks = [
            (b.node, _stream(b), seq_ranges(b.seqs if keep is None else [b.seqs[i] for i in keep]))
            for b, keep in decoded
        ]
        try:
            self.journal.record(marks)
        except OSError as exc:  # the write stands: only a restart's recognition of it is lost
            self.log.warning("journal", "cannot record a write in %s: %s", self.journal.path, exc)

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
            taken: list[Received] = []
            group = self._group(todo, taken)
            if group is None:
                return written
            self._acknowledge(taken)
            written += group

    def _group(self, todo: Iterator[Received], taken_msgs: list[Received]) -> int | None:
        """Decode, check and write messages of ``todo`` (appended to ``taken_msgs``) until
        GROUP_TEXT_BYTES of JSON were decoded; the samples written, None when ``todo`` was empty."""
        decoded: list[tuple[ColumnBatch, list[int] | None]] = []
        pending: dict[tuple[str, str], set[int]] = {}  # seqs taken within this group of messages
        admitted: set[str] = set()  # new node names admitted in this group (written with it)
        replays = 0
        text = 0
        now_ms = -(-time.time_ns() // 1_000_000)  # nothing later is written (bridge/clock.py); ceil: stamps round
        first = next(todo, None)
        if first is None:
            return None
        for m in itertools.chain((first,), todo):
            taken_msgs.append(m)
            batch = self.handler.decode(m)
            if batch is None or not self._admit_node(batch, m, admitted):
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
            if not batch.summary_ms:
                self._twins(batch)
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
        self._refusals.count(converted, self._converter.budget.total)
        outcome = self._writer.write(converted.series)
        now = time.time()
        for batch, keep in decoded:
            self.dedup.mark(batch.node, _stream(batch), batch.seqs if keep is None else [batch.seqs[i] for i in keep])
        self._record(decoded)
        self.metrics.samples.inc(outcome.written)
        if outcome.written:  # health advances only with what remote storage accepted
            total = outcome.written + outcome.rejected
            self.metrics.gpu_samples.inc(round(converted.gpu_samples * outcome.written / total))
            self.metrics.last_write.set(now)
            if converted.newest_ms is not None:
                self.metrics.lag.set(max(0.0, now - converted.newest_ms / 1000))
        return outcome.written

    def _admit_node(self, batch: ColumnBatch, msg: Received, admitted: set[str]) -> bool:
        """Whether ``batch`` is written now. A node name the bridge does not know takes a token
        (``admission.py``); without one its batch is held back, unacknowledged, and written once the name
        gets one; past the waiting room it is dropped and counted. A name admitted earlier in the same
        write group (``admitted``) is known: it takes one token, however many of its batches the group
        coalesced."""
        known = batch.node in admitted or self._converter.knows(batch.node)
        verdict = self.admission.check(batch.node, msg, known)
        if verdict == WRITE:
            if not known:
                self.metrics.new_nodes.inc()
                admitted.add(batch.node)
            return True
        if verdict == HOLD:
            self.metrics.held_back.inc()
            self.log.warning(
                "held_back",
                "holding back the batches of new node %s, unacknowledged: more than --bridge.new-nodes-burst=%d "
                "new node names at once, admitted at --bridge.new-nodes-per-minute=%d (see "
                "gpu_exporter_bridge_held_back_messages)",
                self.nodes.label(batch.node),
                self.new_nodes.burst,
                self.settings.new_nodes_per_minute,
            )
            return False
        self.metrics.new_nodes_refused.inc()
        self.log.warning(
            "new_nodes",
            "dropped a batch of new node %s: %d batches of new node names wait for admission already (half of "
            "--bridge.max-inflight or --bridge.max-inflight-bytes; see gpu_exporter_bridge_new_nodes_refused_total)",
            self.nodes.label(batch.node),
            self.admission.usage()[1],
        )
        return False

    def _twins(self, batch: ColumnBatch) -> None:
        twin = self.twins.seen(batch.node, batch.boot, batch.times_ms[0], batch.times_ms[-1])
        if twin is None:
            return
        label = self.nodes.label(batch.node)
        self.metrics.twin_batches.labels(label).inc()
        self.log.warning(
            "twins",
            "node %s: boots %s and %s publish samples of the same time: two agents run with one node name "
            "(see gpu_exporter_bridge_twin_batches_total)",
            label,
            twin[:40],
            batch.boot[:40],
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop writing (an unfinished write is abandoned, unacknowledged), then disconnect."""
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout)
            self._client.disconnect()
            try:
                self._client.loop_stop()
            except AttributeError:  # paho's network thread ended (the DISCONNECT) between loop_stop's check and join
                pass
        self._writer.close()
        if self.journal is not None:
            self.journal.close()


def _stream(batch: ColumnBatch) -> str:
    """What repeats are told apart by, with the node: the boot, and for summaries a stream of their own
    (a summary point carries the sequence number of its window's last sample, which the raw sample
    still has to bring), and for a part of a sample (payload/split.py) one per part: the other parts of
    the same sample are no replays of it."""
    if batch.health:  # a health report's sequence numbers are its own (payload/health.py)
        return batch.boot + "/health"
    stream = batch.boot + "/summary" if batch.summary_ms else batch.boot
    return f"{stream}/{batch.part}" if batch.part else stream
