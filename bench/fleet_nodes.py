"""Thousands of simulated agents on one asyncio loop, each with its own MQTT 5 connection.

Each node behaves as the agent's forwarder does on a good link (forward/service.py, forward/mqtt.py):
a new connection starts with CONNECT (clean start, a retained last will), then the retained status
``online``; a batch closes every ``interval`` seconds at the node's own phase and is published at QoS 1
with its send time; at most ``WINDOW`` batches are in flight; a batch leaves the node's spool only on a
successful PUBACK; the newest batches go first and a backlog drains oldest first at ``replay_rate``
batches per second behind them; PINGREQ after ``keepalive`` seconds of silence; a lost connection is
retried with the agent's backoff (0.5 s doubling up to 30 s, jittered), and what was in flight is sent
again on the next connection. Payloads come from ``fleet_payloads.Templates``.

The fleet records, per node, every batch the broker acknowledged (``acked``), which is what the
count check compares with the TSDB, and calls ``on_ack`` for each (the lag probes).
"""

from __future__ import annotations

import asyncio
import heapq
import random
import resource
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import fleet_wire as wire
from fleet_payloads import Message, Templates
from gpu_exporter.mqtt import sendtime

__all__ = ["Fleet", "FleetSettings", "Node", "raise_nofile"]

WINDOW = 16  # forward/service.py: batches in flight at once
FIRST_DELAY = 0.5  # forward/mqtt.py: first reconnect delay, doubling up to the cap
CONNECTS_AT_ONCE = 64  # handshakes in progress at once: a listen backlog is finite


def raise_nofile(need: int) -> int:
    """Raise this process's open-file limit towards ``need`` (up to the hard limit); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(soft, min(hard, need)) if hard != resource.RLIM_INFINITY else max(soft, need)
    if want != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    return want


@dataclass
class FleetSettings:
    host: str
    port: int
    nodes: int
    interval: float  # seconds between two batches of one node
    prefix: str = "gpu-exporter"
    keepalive: int = 30  # --mqtt.keepalive
    replay_rate: float = 10.0  # --spool.replay-rate
    max_delay: float = 30.0  # --mqtt.reconnect-max-delay
    first: int = 0  # index of the first node (node names edge-<index>)

    def name(self, index: int) -> str:
        return f"edge-{index:05d}"


@dataclass
class Acked:
    message: Message
    sent: float  # wall clock of the PUBLISH (its ``sent`` stamp)
    acked: float


class _Lost(Exception):
    pass


class Node:
    def __init__(self, index: int, fleet: Fleet) -> None:
        s = fleet.settings
        self.index = index
        self.fleet = fleet
        self.name = s.name(index)
        self.boot = uuid.uuid4().hex
        self.client_id = f"gpu-exporter-{self.name}"
        self.topic = f"{s.prefix}/{self.name}/batch"
        self.status_topic = f"{s.prefix}/{self.name}/status"
        self.next_seq = 1
        self.live: deque[Message] = deque()  # fresh batches, sent first
        self.backlog: deque[Message] = deque()  # oldest first, at the replay rate
        self.inflight: dict[int, tuple[Message, float]] = {}
        self.acked: list[Acked] = []
        self.wake = asyncio.Event()
        self.connected = False
        self.connections = 0
        self._mid = 0
        self._tokens = 1.0
        self._tokens_at = time.monotonic()

    def close_batch(self, last_ms: int, templates: Templates) -> Message:
        """A batch of the node's next ``per_batch`` samples, the newest taken at ``last_ms``."""
        msg = templates.message(self.index, self.name, self.boot, self.next_seq, last_ms)
        self.next_seq += templates.per_batch
        return msg

    def pending(self) -> int:
        return len(self.live) + len(self.backlog) + len(self.inflight)

    def _next_mid(self) -> int:
        self._mid = self._mid % 65535 + 1  # paho's order: a fresh client starts at 1
        return self._mid

    async def run(self, stop: asyncio.Event) -> None:
        attempt = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self._session(stop)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, _Lost):
                pass
            self.connected = False
            for msg, _ in sorted(self.inflight.values(), key=lambda m: m[0].first_seq, reverse=True):
                self.backlog.appendleft(msg)  # still in the spool: sent again, oldest first
            self.inflight.clear()
            if stop.is_set():
                return
            stable = time.monotonic() - started >= 10.0
            attempt = 0 if stable else attempt + 1
            delay = min(self.fleet.settings.max_delay, FIRST_DELAY * 2 ** max(0, attempt - 1))
            delay = random.uniform(0, FIRST_DELAY) if stable else random.uniform(delay / 2, delay)
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass

    async def _session(self, stop: asyncio.Event) -> None:
        s = self.fleet.settings
        async with self.fleet.connecting:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(s.host, s.port), 15)
            try:
                writer.write(wire.connect(self.client_id, s.keepalive, self.status_topic))
                kind, body = await asyncio.wait_for(_read_packet(reader), 15)
            except BaseException:
                writer.close()
                raise
        try:
            if kind != wire.CONNACK or len(body) < 2 or body[1] >= 0x80:
                raise _Lost(f"CONNACK refused: {body[:2].hex()}")
            self.connections += 1
            self.connected = True
            self._mid = 0
            status_mid = self._next_mid()
            writer.write(wire.publish(self.status_topic, b"online", status_mid, retain=True))
            last_out = time.monotonic()
            reading = asyncio.ensure_future(self._read(reader, status_mid))
            try:
                while not stop.is_set() and not reading.done():
                    if self._send(writer):
                        last_out = time.monotonic()
                    now = time.monotonic()
                    if now - last_out >= s.keepalive:
                        writer.write(wire.PINGREQ_PACKET)
                        last_out = now
                    wait = s.keepalive - (now - last_out)
                    if self.backlog and len(self.inflight) < WINDOW:
                        wait = min(wait, max(0.01, (1 - self._tokens) / s.replay_rate))
                    self.wake.clear()
                    try:
                        await asyncio.wait_for(self.wake.wait(), wait)
                    except TimeoutError:
                        pass
                if reading.done():
                    reading.result()  # raises what ended the connection
            finally:
                reading.cancel()
        finally:
            writer.close()

    def _send(self, writer: asyncio.StreamWriter) -> bool:
        """Publish what the window and the replay rate allow (fresh batches first); whether anything went."""
        rate = self.fleet.settings.replay_rate
        now = time.monotonic()
        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)
        self._tokens_at = now
        sent = False
        while len(self.inflight) < WINDOW:
            if self.live:
                msg = self.live.popleft()
            elif self.backlog and self._tokens >= 1:
                msg = self.backlog.popleft()
                self._tokens -= 1
            else:
                break
            mid = self._next_mid()
            when = self.fleet.clock()
            props = wire.sent_properties(round(when * 1000), sendtime.EXPIRY_S)
            writer.write(wire.publish(self.topic, msg.payload, mid, properties=props))
            self.inflight[mid] = (msg, when)
            sent = True
        return sent

    async def _read(self, reader: asyncio.StreamReader, status_mid: int) -> None:
        while True:
            kind, body = await _read_packet(reader)
            if kind == wire.PUBACK:
                mid = int.from_bytes(body[:2], "big")
                ok = len(body) < 3 or body[2] < 0x80
                found = self.inflight.pop(mid, None) if mid != status_mid else None
                if found is not None:
                    msg, when = found
                    if ok:
                        record = Acked(msg, when, self.fleet.clock())
                        self.acked.append(record)
                        self.fleet.acked(self, record)
                    else:  # refused by the broker: kept in the spool, retried later
                        self.backlog.appendleft(msg)
                self.wake.set()
            elif kind == wire.DISCONNECT:
                raise _Lost("broker sent DISCONNECT")
            # PINGRESP, and the PUBACK of the status message (status_mid): nothing to do


async def _read_packet(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first = (await reader.readexactly(1))[0]
    length, shift = 0, 0
    while True:
        byte = (await reader.readexactly(1))[0]
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    body = await reader.readexactly(length) if length else b""
    return first & 0xF0, body


@dataclass
class Fleet:
    """``settings.nodes`` simulated agents publishing ``templates``' batches every ``settings.interval``."""

    settings: FleetSettings
    templates: Templates
    on_ack: Callable[[Node, Acked], None] | None = None
    clock: Callable[[], float] = time.time
    nodes: list[Node] = field(default_factory=list)
    published: int = 0  # batches closed by the schedule

    def __post_init__(self) -> None:
        self.connecting = asyncio.Semaphore(CONNECTS_AT_ONCE)
        self.nodes = [Node(self.settings.first + i, self) for i in range(self.settings.nodes)]
        self.stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def acked(self, node: Node, record: Acked) -> None:
        if self.on_ack is not None:
            self.on_ack(node, record)

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(n.run(self.stop)) for n in self.nodes]

    async def wait_connected(self, timeout: float) -> int:
        """Nodes connected once ``timeout`` passed or all are."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(not n.connected for n in self.nodes):
            await asyncio.sleep(0.2)
        return sum(n.connected for n in self.nodes)

    async def publish_for(self, duration: float, phases: float | None = None) -> None:
        """Close a batch per node every ``interval`` for ``duration`` seconds, phases spread evenly."""
        s = self.settings
        spread = s.interval if phases is None else phases
        start = time.monotonic()
        wall = self.clock() - start
        order = list(range(len(self.nodes)))
        random.Random(s.nodes).shuffle(order)  # neighbours in name are not neighbours in time
        heap = [(start + spread * k / len(self.nodes), i) for k, i in enumerate(order)]
        heapq.heapify(heap)
        end = start + duration
        while heap and heap[0][0] < end:
            due, i = heap[0]
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            heapq.heapreplace(heap, (due + s.interval, i))
            node = self.nodes[i]
            # stamped by the schedule, as the agent's drift-free sampler stamps its samples: a late turn
            # of a loaded loop must not make a batch overlap the node's previous one
            node.live.append(node.close_batch(round((due + wall) * 1000), self.templates))
            self.published += 1
            node.wake.set()

    def add_backlog(self, batches: int, span: float) -> None:
        """``batches`` closed batches per node waiting in its spool, the newest taken now, spread over
        ``span`` seconds before it (the time the node was cut off)."""
        now_ms = round(self.clock() * 1000)
        for node in self.nodes:
            for b in range(batches):
                last = now_ms - round(span * 1000 * (batches - 1 - b) / batches)
                node.backlog.append(node.close_batch(last, self.templates))
                self.published += 1
            node.wake.set()

    def pending(self) -> int:
        return sum(n.pending() for n in self.nodes)

    async def drain(self, timeout: float) -> bool:
        """Wait until every batch closed so far is acknowledged by the broker."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.pending():
                return True
            await asyncio.sleep(0.2)
        return False

    async def close(self) -> None:
        self.stop.set()
        for n in self.nodes:
            n.wake.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
