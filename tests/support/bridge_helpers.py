"""Helpers shared by the bridge tests: a minimal protobuf reader and a scripted HTTP receiver."""

from __future__ import annotations

import http.server
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import cramjam
import paho.mqtt.client as mqtt

from gpu_exporter import catalog
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch

from .ports import listens_on
from .procs import child_env
from .tsdb import MosquittoServer, free_port, http_get, wait_until


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


# ------------------------------------------------------------------------------------ batches and MQTT

KEYS = ("utilization", "memory_used", "temp_gpu", "power", "energy", "clock_sm", "pcie_tx")


def make_batch(
    node: str, boot: str, seqs: list[int], t0: float, gpus: int = 2, step: float = 5.0, mig: bool = False
) -> Batch:
    """A batch as an exporter would forward it: ``gpus`` devices, a handful of catalog metrics each."""
    samples = []
    for seq in seqs:
        devices = []
        for g in range(gpus):
            values: dict[tuple[str, tuple[str, ...]], float] = {
                ("utilization", ()): round(((seq * 7 + g * 13) % 100) / 100, 2),
                ("memory_used", ()): float(1024 * 1024 * (1000 + seq + g)),
                ("temp_gpu", ()): float(40 + (seq + g) % 30),
                ("power", ()): round(100 + (seq % 50) * 1.5 + g, 3),
                ("energy", ()): 1000.0 * seq + g,
                ("clock_sm", ()): 1_410_000_000.0,
                ("pcie_tx", ()): float(1000 * (seq % 17)),
            }
            if seq % 3 == 0:
                values[("xid_errors", ("79",))] = float(seq // 3)
            device = DeviceId(str(g), f"GPU-{node}-{g}")
            if mig and g == 0:
                device = DeviceId("0", f"MIG-{node}-0", "1", "0", "1g.10gb", f"GPU-{node}-0")
            devices.append(DeviceSample(device, True, values, {"name": "Simulated GPU", "driver": "550.1"}))
        samples.append(Sample(seq, t0 + (seq - seqs[0]) * step, tuple(devices)))
    return Batch(node, boot, tuple(samples))


def expected_points(batch: Batch, node_label: str = "node") -> set[tuple[frozenset[tuple[str, str]], int, float]]:
    """Every (labels, timestamp ms, value) a receiver should hold for ``batch``'s device metrics."""
    out = set()
    for sample in batch.samples:
        ts = round(sample.timestamp * 1000)
        for dev in sample.devices:
            for (key, dyn), value in dev.values.items():
                metric = catalog.by_key(key)
                labels = {"__name__": metric.name, node_label: batch.node, **dict(dev.device.labels())}
                labels.update(metric.const_labels)
                labels.update(zip(metric.labels, dyn, strict=True))
                out.add((frozenset(labels.items()), ts, value))
    return out


def stored_points(
    samples: dict[frozenset[tuple[str, str]], list[tuple[int, float]]],
) -> set[tuple[frozenset[tuple[str, str]], int, float]]:
    return {(labels, t, v) for labels, points in samples.items() for t, v in points}


class Publisher:
    """A QoS 1 MQTT publisher that waits for each PUBACK."""

    def __init__(self, port: int, client_id: str = "test-publisher") -> None:
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes, retain: bool = False, timeout: float = 10.0) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(timeout)
        if not info.is_published():
            raise TimeoutError(f"no PUBACK for {topic} within {timeout}s")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class BridgeProcess:
    def __init__(self, tmp: Path, broker: MosquittoServer, write_url: str, client_id: str, *extra: str) -> None:
        self.port = free_port()
        self.log = tmp / f"bridge-{client_id}.log"
        self.args = [
            f"--mqtt.url={broker.url}",
            f"--remote-write.url={write_url}",
            f"--bridge.client-id={client_id}",
            f"--bridge.listen-address=127.0.0.1:{self.port}",
            "--remote-write.max-backoff=500ms",
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> BridgeProcess:
        for attempt in range(3):
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "gpu_exporter", "bridge", *self.args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=child_env(),
                )
            try:
                wait_until(lambda: self._own_page() and b"mqtt_connected 1.0" in self.page(), 20, "bridge")
                return self
            except RuntimeError:
                if attempt == 2 or b"address already in use" not in self.log.read_bytes():
                    raise
            old, self.port = self.port, free_port()  # the port went to another test's process
            self.args = [a.replace(f"127.0.0.1:{old}", f"127.0.0.1:{self.port}") for a in self.args]
        raise AssertionError("unreachable")

    def page(self) -> bytes:
        return http_get(f"http://127.0.0.1:{self.port}/metrics")

    def _own_page(self) -> bool:
        """Whether this bridge process holds the listening socket of its port: a port from free_port()
        may have been handed to another test's process too (then whichever binds second exits), and the
        page of another test's bridge must not pass for this one's."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"bridge exited with {self.proc.returncode}:\n{self.log.read_text()[-2000:]}")
        return listens_on(self.proc.pid, self.port)

    def metric(self, name: str) -> float:
        for line in http_get(f"http://127.0.0.1:{self.port}/metrics").decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(15)


class WaitRecorder(threading.Event):
    """A stop event that is never set and records each wait (a backoff) instead of sleeping it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return False
