"""Batches of simulated 8-GPU nodes, made as the agent makes them, cheaply enough for 5,000 nodes.

The agent reads its backend every interval (``--gpu-vendor=fake``: the real NVML backend over the
simulated library), rounds the values (``forward.prepare.round_values``) and, when a batch closes,
encodes its samples (``payload.encode``: JSON, zlib level 9 with the payload's dictionary). Done
for every node, that costs about 130 ms of CPU per 24-sample batch: 5,000 nodes would need a core of
their own. So the bench reads the simulator once per *template* (a window of consecutive samples of one
simulated node; the templates are consecutive windows of one simulated run) and gives every message of
every node a template whose document (``batch.to_document``) it then patches with what is the node's
own: node name, boot id, sequence numbers, timestamps (now, spaced like the node's interval, with a few
ms of jitter), GPU UUIDs and serials. A node's batches take consecutive templates from a start of its
own, so its values change from batch to batch, its counters rise as a real node's do (the bridge drops
a counter that goes backwards), and neighbours differ; the serialisation and compression are the
agent's, per message. Past ``count - 16`` batches of one node a counter would go back once.

``Templates.samples`` gives the ``Sample`` objects a message stands for, so that
tests/unit/bench/test_bench_fleet_wire.py can check that the payload equals the agent's own ``encode`` of them.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import zlib
from typing import Any

from gpu_exporter import catalog
from gpu_exporter import config as cfg
from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.forward.prepare import round_values
from gpu_exporter.model import DeviceSample, Sample
from gpu_exporter.payload import Batch, to_document
from gpu_exporter.payload._zdict import ZDICT

__all__ = ["Message", "Templates", "device_uuid"]

SAMPLE_INTERVAL = 5.0  # the agent's default --interval: how far apart the simulator is read
LEVEL = 9  # payload.encode's default, as the forwarder spools a closed batch


def device_uuid(node: int, gpu: int) -> str:
    """The simulator's UUID pattern (backends/fake/backend.py) with the node's index as the seed: unique per node."""
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-0000000000{gpu:02x}"


def device_serial(node: int, gpu: int) -> str:
    return f"16523{node:03d}{gpu:05d}"


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """One batch of one node: what it holds and its payload."""

    node: int
    first_seq: int
    times_ms: tuple[int, ...]  # one per sample
    payload: bytes
    gpu_samples: int
    rw_samples: int  # remote-write samples the bridge makes of it: values, gpu_up and gpu_info

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.times_ms) - 1


class _Template:
    __slots__ = ("doc", "gpus", "offsets_ms", "rw_samples", "samples")

    def __init__(self, samples: list[Sample], offsets_ms: list[int]) -> None:
        self.samples = samples
        self.offsets_ms = offsets_ms
        self.doc = to_document(Batch("template", "template", tuple(samples)))
        self.gpus = len(samples[0].devices)
        info = sum(1 for d in samples[0].devices if d.info)
        self.rw_samples = sum(len(d.values) + 1 for s in samples for d in s.devices) + info * len(samples)


class Templates:
    """``count`` templates of ``per_batch`` samples of a ``gpus``-GPU simulated node.

    ``spacing`` is the time between a node's samples in the payload (the agent's interval, divided by
    the bench's rate factor); the simulator itself always advances by the agent's 5 s, so the values
    move as a real node's do between two samples.
    """

    def __init__(self, gpus: int = 8, per_batch: int = 24, spacing: float = 5.0, count: int = 64) -> None:
        self.gpus = gpus
        self.per_batch = per_batch
        config = cfg.replace(cfg.Config(), gpu_vendor="fake", fake_gpus=gpus)
        keys = catalog.kept_keys(config.metrics_include, config.metrics_exclude)
        self._templates: list[_Template] = []
        now = [1_700_000_000.0]
        sim = SimNvml(gpus=gpus, seed=0, clock=lambda: now[0])
        backend = NvmlBackend(config, nvml=sim)
        backend.open()
        backend.name = "fake"
        backend.read()  # a running agent's first read is long past: GPM ratios need a previous sample
        now[0] += SAMPLE_INTERVAL
        for t in range(count):  # consecutive windows of one run: counters rise from one to the next
            samples = []
            offsets = []
            for i in range(per_batch):
                reading = tuple(backend.read())
                samples.append(round_values(Sample(i + 1, 0.0, reading), config.mqtt_value_digits, keys, None))
                # the sampler's schedule is drift-free; its timestamps jitter by a few milliseconds
                offsets.append(round(i * spacing * 1000) + (7 * t + 3 * i * i) % 9)
                now[0] += SAMPLE_INTERVAL
            self._templates.append(_Template(samples, offsets))
        backend.close()

    @property
    def span_ms(self) -> int:
        return max(t.offsets_ms[-1] for t in self._templates)

    def _pick(self, node: int, first_seq: int) -> _Template:
        start = (node * 7) % 16
        return self._templates[(start + (first_seq - 1) // self.per_batch) % len(self._templates)]

    def message(self, node: int, name: str, boot: str, first_seq: int, last_ms: int) -> Message:
        """The batch of ``node`` holding ``per_batch`` samples from ``first_seq``, the newest taken at ``last_ms``."""
        tpl = self._pick(node, first_seq)
        start = last_ms - tpl.offsets_ms[-1]
        times = tuple(start + o for o in tpl.offsets_ms)
        doc = dict(tpl.doc)  # shallow: only the fields below change, the columns are shared
        n = len(times)
        doc["node"] = name
        doc["boot"] = boot
        doc["first_seq"] = first_seq
        doc["last_seq"] = first_seq + n - 1
        doc["seq"] = [first_seq] + [1] * (n - 1)
        doc["time_ms"] = [times[0]] + [b - a for a, b in itertools.pairwise(times)]
        devices = []
        for g, dev in enumerate(tpl.doc["devices"]):
            mine: dict[str, Any] = dict(dev)
            mine["id"] = {**dev["id"], "uuid": device_uuid(node, g)}
            if "info" in dev:
                mine["info"] = {**dev["info"], "serial": device_serial(node, g)}
            devices.append(mine)
        doc["devices"] = devices
        text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        deflater = zlib.compressobj(LEVEL, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, ZDICT)
        payload = deflater.compress(text) + deflater.flush()
        return Message(node, first_seq, times, payload, n * tpl.gpus, tpl.rw_samples)

    def samples(self, node: int, first_seq: int, last_ms: int) -> list[Sample]:
        """The samples ``message`` encodes, as the agent would hold them (for the fidelity test)."""
        tpl = self._pick(node, first_seq)
        start = last_ms - tpl.offsets_ms[-1]
        out = []
        for i, s in enumerate(tpl.samples):
            devices = []
            for g, d in enumerate(s.devices):
                device = dataclasses.replace(d.device, uuid=device_uuid(node, g))
                info = {**d.info, "serial": device_serial(node, g)} if d.info else d.info
                devices.append(DeviceSample(device, d.up, copy.copy(d.values), info, d.processes))
            out.append(Sample(first_seq + i, (start + tpl.offsets_ms[i]) / 1000, tuple(devices)))
        return out
