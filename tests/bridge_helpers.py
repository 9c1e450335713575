"""Helpers shared by the bridge tests: a minimal protobuf reader and a scripted HTTP receiver."""

from __future__ import annotations

import http.server
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import cramjam


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int, object]]:
    """(field number, wire type, value) of a protobuf message, written from the encoding rules."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 1:
            yield number, wire, struct.unpack_from("<d", buf, pos)[0]
            pos += 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            yield number, wire, buf[pos : pos + length]
            pos += length
        else:
            raise ValueError(f"unexpected wire type {wire}")


def decode_write_request(body: bytes) -> list[tuple[list[tuple[str, str]], list[tuple[int, float]]]]:
    """WriteRequest bytes -> [(labels in wire order, [(timestamp ms, value)])]."""
    out = []
    for number, _, ts_bytes in fields(body):
        assert number == 1
        labels: list[tuple[str, str]] = []
        samples: list[tuple[int, float]] = []
        for n, _, part in fields(ts_bytes):  # type: ignore[arg-type]
            if n == 1:
                kv = {k: v for k, _, v in fields(part)}  # type: ignore[arg-type]
                labels.append((kv[1].decode(), kv[2].decode()))  # type: ignore[union-attr]
            elif n == 2:
                sv = {k: v for k, _, v in fields(part)}  # type: ignore[arg-type]
                ts = int(sv.get(2, 0))  # type: ignore[call-overload]
                if ts >= 1 << 63:
                    ts -= 1 << 64
                samples.append((ts, float(sv.get(1, 0.0))))  # type: ignore[arg-type]
        out.append((labels, samples))
    return out


@dataclass
class Received:
    headers: dict[str, str]
    series: list[tuple[list[tuple[str, str]], list[tuple[int, float]]]]


@dataclass
class ScriptedReceiver:
    """An HTTP remote-write endpoint whose answers a test scripts: ``answer(request_number)``."""

    answer: Callable[[int], tuple[int, bytes, dict[str, str]]]
    requests: list[Received] = field(default_factory=list)
    server: http.server.ThreadingHTTPServer | None = None

    def __enter__(self) -> ScriptedReceiver:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                body = bytes(cramjam.snappy.decompress_raw(raw))
                outer.requests.append(Received(dict(self.headers.items()), decode_write_request(body)))
                status, text, headers = outer.answer(len(outer.requests))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v1/write"
