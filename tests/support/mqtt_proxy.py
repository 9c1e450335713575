"""A TCP proxy between a client and a real Mosquitto that reads the MQTT packets passing through.

It measures what a test needs to see on the wire: the size of every PUBLISH the client sends, how many
QoS 1 PUBLISHes are unacknowledged at once (against the broker's Receive Maximum), how many CONNACKs the
broker sent (one per connection), and it can cut each connection ``cut_after`` seconds after its
CONNACK (a flapping link), or delay what the broker sends (``latency``). Threads, 127.0.0.1 only, stopped by ``close``.

It can also make the broker worse than any real one: ``swallow_pubacks`` drops every PUBACK on its way
to the client (a broker that takes batches and never acknowledges them, while it still answers PINGREQ),
and ``flood`` makes the next connections' broker, right after its CONNACK, start a PUBLISH whose header
announces that many bytes and send them as fast as the client reads.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import dataclass, field

CONNECT, CONNACK, PUBLISH, PUBACK = 1, 2, 3, 4


def _split(buffer: bytearray) -> tuple[int, int, bytes] | None:
    """The first whole packet of ``buffer`` as (first byte, total size, body), removed from it; None if
    it has not all arrived yet. (The packet's bytes were ``buffer[:total]`` before the call.)"""
    if len(buffer) < 2:
        return None
    length, shift, pos = 0, 0, 1
    while True:
        if pos >= len(buffer):
            return None
        byte = buffer[pos]
        length |= (byte & 0x7F) << shift
        shift += 7
        pos += 1
        if not byte & 0x80:
            break
    total = pos + length
    if len(buffer) < total:
        return None
    first, body = buffer[0], bytes(buffer[pos:total])
    del buffer[:total]
    return first, total, body


@dataclass
class Wire:
    """What the proxy saw (read under ``lock``)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    publish_sizes: list[int] = field(default_factory=list)
    inflight: set[tuple[int, int]] = field(default_factory=set)  # (connection, packet id)
    max_inflight: int = 0
    connacks: list[float] = field(default_factory=list)  # monotonic time of each CONNACK
    connects: list[bytes] = field(default_factory=list)  # the body of each CONNECT
    connections: int = 0
    pubacks_swallowed: int = 0
    flooded: int = 0  # bytes of flood the client read


class Proxy:
    def __init__(self, upstream_port: int, cut_after: float | None = None, latency: float = 0.0) -> None:
        self.upstream = upstream_port
        self.cut_after = cut_after
        self.latency = latency  # seconds added to everything the broker sends (a long round trip)
        self.wire = Wire()
        self.blocked = False  # while True, each connection is closed at once (the WAN is cut)
        self.swallow_pubacks = False  # while True, no PUBACK reaches the client
        self.flood = 0  # announced size of the PUBLISH flood (0: none)
        self.flood_connections = 0  # how many more connections get the flood
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self._server.settimeout(0.2)
        self.port = int(self._server.getsockname()[1])
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def __enter__(self) -> Proxy:
        self._accepting.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        self._accepting.join(5)
        for s in list(self._socks):
            with contextlib.suppress(OSError):
                s.close()
        for t in self._threads:
            t.join(5)
        self._server.close()

    def take_over(self) -> None:
        """Disconnect every client as an MQTT 5 broker does when another client connects with the same
        client id: DISCONNECT with reason 0x8E (Session taken over), then close (Mosquitto 2.0.15 and later,
        EMQX, HiveMQ; Debian's Mosquitto 2.0.11 closes without a word)."""
        for client in list(self._socks[0::2]):
            with contextlib.suppress(OSError):
                client.sendall(b"\xe0\x01\x8e")
        self.drop_connections()

    def drop_connections(self) -> None:
        """Close every connection open now (a broker restart): the client connects again."""
        for s in list(self._socks):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        n = 0
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            n += 1
            if self.blocked:
                client.close()
                continue
            try:
                broker = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                client.close()
                continue
            with self.wire.lock:
                self.wire.connections += 1
            self._socks += [client, broker]
            pair = (client, broker)
            for args in ((client, broker, n, True), (broker, client, n, False)):
                t = threading.Thread(target=self._pump, args=(*args, pair), daemon=True)
                t.start()
                self._threads.append(t)

    def _cut(self, pair: tuple[socket.socket, socket.socket]) -> None:
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _pump(
        self, src: socket.socket, dst: socket.socket, conn: int, upward: bool, pair: tuple[socket.socket, ...]
    ) -> None:
        buffer = bytearray()
        src.settimeout(0.1)
        cut_at: float | None = None
        while not self._stop.is_set():
            if cut_at is not None and time.monotonic() >= cut_at:
                self._cut(pair)  # type: ignore[arg-type]
                return
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            if not upward and self.latency:
                time.sleep(self.latency)  # before the PUBACKs are counted: the client's view of the window
            buffer += data
            out = bytearray()
            while True:
                raw = bytes(buffer)
                packet = _split(buffer)
                if packet is None:
                    break
                first, size, body = packet
                kind = first >> 4
                if not upward and kind == PUBACK and self.swallow_pubacks:
                    with self.wire.lock:
                        self.wire.pubacks_swallowed += 1
                else:
                    out += raw[:size]
                with self.wire.lock:
                    if upward and kind == CONNECT:
                        self.wire.connects.append(body)
                    elif upward and kind == PUBLISH and (first >> 1) & 3:
                        topic_len = int.from_bytes(body[:2], "big")
                        pid = int.from_bytes(body[2 + topic_len : 4 + topic_len], "big")
                        self.wire.publish_sizes.append(size)
                        self.wire.inflight.add((conn, pid))
                        mine = sum(1 for c, _ in self.wire.inflight if c == conn)
                        self.wire.max_inflight = max(self.wire.max_inflight, mine)
                    elif upward and kind == PUBLISH:
                        self.wire.publish_sizes.append(size)
                    elif not upward and kind == PUBACK:
                        self.wire.inflight.discard((conn, int.from_bytes(body[:2], "big")))
                    elif not upward and kind == CONNACK:
                        self.wire.connacks.append(time.monotonic())
                        if self.cut_after is not None:
                            cut_at = time.monotonic() + self.cut_after
            try:
                dst.sendall(data if upward else bytes(out))  # the broker's side goes packet by packet
                if not upward and out and out[0] >> 4 == CONNACK and self.flood and self.flood_connections:
                    self.flood_connections -= 1
                    self._flood(dst)
                    break
            except OSError:
                break
        self._cut(pair)  # type: ignore[arg-type]

    def _flood(self, client: socket.socket) -> None:
        """A PUBLISH announced as ``flood`` bytes, sent as fast as the client takes it (until it closes)."""
        n, length = self.flood, bytearray()
        while True:
            byte, n = n % 128, n // 128
            length.append(byte | (0x80 if n else 0))
            if not n:
                break
        client.settimeout(10)
        client.sendall(bytes([0x30]) + bytes(length) + b"\x00\x03a/b")  # QoS 0, topic "a/b"
        chunk = b"\x00" * (1 << 20)
        sent = 5
        while sent < self.flood and not self._stop.is_set():
            try:
                sent += client.send(chunk)
            except OSError:
                break
            with self.wire.lock:
                self.wire.flooded = sent
