"""Hostile payloads for the bridge (issue 20's attack), shared by tests/test_bridge_*.py and
bench/bench_bridge_attack.py: each builder makes what a publisher could put on a node's topic."""

from __future__ import annotations

import hashlib
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.clock import Stamp
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, encode
from gpu_exporter.payload._zdict import ZDICT

__all__ = [
    "bomb",
    "info_flood",
    "junk_document",
    "local_bridge",
    "message",
    "peak_rss",
    "rss",
    "series_flood",
    "value",
]


def _head(node: str, t_ms: int) -> bytes:
    """A valid batch header up to the opening of its devices array."""
    head = {
        "format": "gpu-exporter.batch",
        "version": 3,
        "node": node,
        "boot": "attack",
        "first_seq": 1,
        "last_seq": 1,
        "seq": [1],
        "time_ms": [t_ms],
        "metrics": [],
    }
    return json.dumps(head, separators=(",", ":")).encode()[:-1] + b',"devices":['


def junk_document(node: str, size: int, t_ms: int, unit: bytes = b"[],") -> bytes:
    """Plain JSON of ``size`` bytes with a valid header and a devices array of empty containers: the
    most Python objects per byte a JSON parser can be made to build (each ``[]`` is a 56-byte list)."""
    head = _head(node, t_ms)
    count = max(1, (size - len(head) - 3) // len(unit))
    return head + unit * count + b"{}]}"


def bomb(node: str, inflated: int, t_ms: int) -> bytes:
    """zlib with the payload's preset dictionary: ``inflated`` bytes of ``{},`` that compress ~1000:1."""
    text = junk_document(node, inflated, t_ms, unit=b"{},")
    deflate = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, ZDICT)
    return deflate.compress(text) + deflate.flush()


def info_flood(
    node: str, t: float, keys: int = 5000, value_len: int = 1000, devices: int = 1, noise: bool = False
) -> bytes:
    """A valid batch whose devices carry ``keys`` identity strings of ``value_len`` characters each:
    repetitive (compressing some 200 times, as in the attack) or, with ``noise``, hex digits that
    compress about twice."""

    def text(i: int) -> str:
        if not noise:
            return f"{i:05d}" + "v" * (value_len - 5)
        digest = hashlib.sha256(str(i).encode()).hexdigest()
        return (digest * (value_len // len(digest) + 1))[:value_len] if i % 2 else os.urandom(value_len // 2).hex()

    info = {f"k{i:05d}": text(i) for i in range(keys)}
    devs = tuple(
        DeviceSample(DeviceId(str(d), f"GPU-{node}-{d}"), True, {("temp_gpu", ()): 40.0}, info) for d in range(devices)
    )
    return encode(Batch(node, "boot-1", (Sample(1, t, devs),)))


def series_flood(nodes: list[str], total: int, t: float, devices: int = 10) -> list[tuple[str, bytes]]:
    """(topic, payload): ``total`` distinct XID series spread evenly over ``nodes``, one message per node."""
    per_node = total // len(nodes)
    per_device = per_node // devices
    out = []
    for n, node in enumerate(nodes):
        devs = []
        for d in range(devices):
            base = (n * devices + d) * per_device
            values = {("xid_errors", (str(base + i),)): 1.0 for i in range(per_device)}
            devs.append(DeviceSample(DeviceId(str(d), f"GPU-{node}-{d}"), True, values, {}))
        out.append((f"gpu-exporter/{node}/batch", encode(Batch(node, "boot-1", (Sample(1, t, tuple(devs)),)))))
    return out


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    return _status_kib(pid, "VmHWM")


def rss(pid: int) -> int:
    """The process's resident set now (VmRSS), in bytes."""
    return _status_kib(pid, "VmRSS")


def local_bridge(url: str, **settings: Any) -> tuple[Bridge, CollectorRegistry]:
    """A bridge whose writer path (``Bridge.process``) tests call directly, writing to ``url``."""
    registry = CollectorRegistry()
    clock = settings.pop("clock", time.monotonic)
    full = BridgeSettings(mqtt_url="mqtt://127.0.0.1:1", remote_write_url=url, rw_backoff_max=0.05, **settings)
    return Bridge(full, registry, clock=clock), registry


def message(batch: Batch, mid: int = 1, topic_node: str | None = None) -> Received:
    """``batch`` as the bridge's MQTT thread would queue it."""
    stamp = Stamp(time.time_ns() // 1_000_000)
    return Received(mid, 1, f"gpu-exporter/{topic_node or batch.node}/batch", encode(batch), stamp)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0
