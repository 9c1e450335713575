"""A TCP proxy on 127.0.0.1 that stands where the WAN is: it can be cut, restored, slowed and delayed.

Usage::

    with TcpProxy(("127.0.0.1", broker_port)) as wan:
        client.connect("127.0.0.1", wan.port)
        wan.cut()                   # close every connection and refuse new ones (a link that is down)
        wan.cut(silent=True)        # or keep them open and drop every byte (a link that went dark)
        wan.restore()
        wan.shape(rate=64_000, latency=0.2)   # bytes per second each way, one-way delay in seconds
        wan.shape()                           # back to unshaped

The proxy runs its own asyncio loop on a daemon thread; every public method is thread-safe and returns
once the change is in effect. Each direction of a connection is a reader that stamps each chunk with
its arrival time and a writer that sends it no earlier than ``arrival + latency``, then waits as long
as ``rate`` requires, so a delay does not reduce throughput and bytes never overtake each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Stats", "TcpProxy"]

T = TypeVar("T")
CHUNK = 16 * 1024


@dataclass
class Stats:
    """What went through the proxy so far."""

    connections: int = 0  # accepted while not cut
    refused: int = 0  # connections that arrived while cut (closed at once, or silently held)
    bytes_up: int = 0  # client -> upstream, delivered
    bytes_down: int = 0  # upstream -> client, delivered
    bytes_dropped: int = 0  # swallowed while silently cut


class _Link:
    """One proxied connection: a pump each way, and the two streams they own."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter | None = None) -> None:
        self.writers = [w for w in (client, upstream) if w is not None]
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for task in self.tasks:
            task.cancel()
        for writer in self.writers:
            writer.transport.abort()


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.upstream = upstream
        self._listen = listen
        self.port = 0
        self.stats = Stats()
        self.rate: float | None = None  # bytes per second, each direction; None: unlimited
        self.latency = 0.0  # seconds, one way
        self._state = "up"  # up | refuse | silent
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)

    # ------------------------------------------------------------------ control (any thread)

    def start(self) -> TcpProxy:
        self._thread.start()
        self._call(self._listen_now())
        return self

    def stop(self) -> None:
        """Close the listener and every connection, and end the loop's thread."""
        if not self._thread.is_alive():
            return
        self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def cut(self, silent: bool = False) -> None:
        """Take the link down.

        By default every connection is reset and new ones are refused, as when a router says the network
        is unreachable. ``silent=True`` is a link that went dark: connections stay open, new ones are
        accepted, and every byte either way is dropped, so only a timeout (MQTT keepalive) notices.
        """
        self._call(self._cut(silent))

    def restore(self) -> None:
        """Bring the link back (on the same port); connections held open by a silent cut stay dead."""
        self._call(self._restore())

    def shape(self, rate: float | None = None, latency: float = 0.0) -> None:
        """Limit each direction to ``rate`` bytes per second and delay it by ``latency`` seconds."""
        if rate is not None and rate <= 0:
            raise ValueError(f"rate must be positive, not {rate}")
        if latency < 0:
            raise ValueError(f"latency must not be negative, not {latency}")
        self.rate, self.latency = rate, latency

    @property
    def is_up(self) -> bool:
        return self._state == "up"

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # ------------------------------------------------------------------ the loop's side

    async def _listen_now(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self._listen[0], self.port or self._listen[1], reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self._links):
            link.abort()
        self._links.clear()
        if server is not None:
            await server.wait_closed()

    async def _cut(self, silent: bool) -> None:
        self._state = "silent" if silent else "refuse"
        if not silent:
            await self._close()

    async def _restore(self) -> None:
        was, self._state = self._state, "up"
        if was == "silent":
            # a dark link's connections never come back: their peers must time out and reconnect
            for link in list(self._links):
                link.abort()
            self._links.clear()
        if self._server is None:
            await self._listen_now()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._state != "up":
            self.stats.refused += 1
            if self._state == "refuse":
                writer.transport.abort()
                return
            held = _Link(writer)  # silent: accepted, and everything it sends is dropped
            self._links.add(held)
            held.tasks = [asyncio.create_task(self._pump(held, reader, None, "bytes_up"))]
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self.stats.connections += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, up_writer, "bytes_up")),
            asyncio.create_task(self._pump(link, up_reader, writer, "bytes_down")),
        ]

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, counter: str
    ) -> None:
        """Copy one direction until end of stream, which is passed on as a half-close; an error ends both."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(queue, writer, counter)) if writer is not None else None
        clean = False
        try:
            while chunk := await reader.read(CHUNK):
                if self._state == "silent" or sender is None:
                    self.stats.bytes_dropped += len(chunk)
                    continue
                queue.put_nowait((time.monotonic(), chunk))
            if sender is not None:
                queue.put_nowait((time.monotonic(), b""))
                await sender
            clean = True
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            if sender is not None:
                sender.cancel()
            done = all(t.done() or t is asyncio.current_task() for t in link.tasks)
            if not clean or done:
                link.abort()
                self._links.discard(link)

    async def _send(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter, counter: str
    ) -> None:
        budget = 0.0  # monotonic time before which the rate allows nothing more to be sent
        while True:
            arrived, chunk = await queue.get()
            if not chunk:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            delay = arrived + self.latency - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self._state == "silent":
                self.stats.bytes_dropped += len(chunk)
                continue
            rate = self.rate
            if rate is None:
                writer.write(chunk)
                await writer.drain()
            else:
                # in slices of a tenth of a second's worth, each sent only when the rate allows it
                step = max(1, int(rate / 10))
                for start in range(0, len(chunk), step):
                    piece = chunk[start : start + step]
                    wait = budget - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    budget = max(budget, time.monotonic()) + len(piece) / rate
                    writer.write(piece)
                    await writer.drain()
            setattr(self.stats, counter, getattr(self.stats, counter) + len(chunk))
