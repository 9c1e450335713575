"""Cutting a batch into payloads that fit a size limit: the broker's Maximum Packet Size, or the largest
packet the link carries within the keepalive (forward/link_meter.py).

A batch of several samples is cut in halves, as often as needed. One sample that is still too large is
cut by device (consecutive devices, as many to a part as fit), and one device that alone is too large by
series (in sorted order, as many as fit). Nothing that fits as a single series is ever dropped; only a
series whose payload alone is over the limit cannot go (the caller counts it).

A payload that holds only some devices or series of its samples is a *part*, named in ``Batch.part`` by
what it holds (a hash of the device identities, and of the series when a device is cut): the receiver
drops a repeat by (node, boot, part, seq), so the second part of a sample is not taken for a replay of
the first, while the same part sent twice still is. A name depends only on the content, so a part cut
again later (a broker with a smaller limit) gets the names its pieces would have had from the start.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence

from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey
from gpu_exporter.payload.encode import encode
from gpu_exporter.payload.types import Batch

__all__ = ["Encoded", "Unfit", "part_name", "split"]

Encoded = tuple[Batch, bytes]
Unfit = tuple[Sample, int]  # what cannot fit: one device's single series (or bare device), its payload's size


def part_name(devices: Sequence[DeviceId], series: Sequence[SeriesKey] | None = None) -> str:
    """The name of a part holding ``devices`` whole, or only ``series`` of the one device given."""
    what: list[object] = ["d", sorted(d.fields() for d in devices)]
    if series is not None:
        what = ["s", devices[0].fields(), sorted([k, list(labels)] for k, labels in series)]
    text = json.dumps(what, separators=(",", ":")).encode()
    return hashlib.blake2b(text, digest_size=8).hexdigest()


def split(
    batch: Batch, limit: int, *, hard: bool = True, encoder: Callable[[Batch], bytes] = encode
) -> tuple[list[Encoded], list[Unfit]]:
    """Payloads of ``batch`` of at most ``limit`` bytes, in sequence order, and what cannot fit.

    With ``hard=False`` (a soft cap such as --mqtt.batch-max-bytes) samples are only cut apart, and a
    single sample over the cap goes as it is."""
    out: list[Encoded] = []
    unfit: list[Unfit] = []
    _split(batch, encoder(batch), limit, hard, encoder, out, unfit)
    return out, unfit


def _split(
    batch: Batch,
    data: bytes,
    limit: int,
    hard: bool,
    encoder: Callable[[Batch], bytes],
    out: list[Encoded],
    unfit: list[Unfit],
) -> None:
    if len(data) <= limit:
        out.append((batch, data))
        return
    samples = batch.samples
    if len(samples) > 1:
        half = len(samples) // 2
        for piece in (samples[:half], samples[half:]):
            sub = Batch(batch.node, batch.boot, piece, batch.summary_ms, batch.part)
            _split(sub, encoder(sub), limit, hard, encoder, out, unfit)
        return
    if not hard:
        out.append((batch, data))
        return
    sample = samples[0]
    devices = sample.devices
    if len(devices) > 1:
        for group in _groups(len(devices), lambda i, j: _device_part(batch, sample, devices[i:j]), encoder, limit):
            sub = _device_part(batch, sample, devices[group[0] : group[1]])
            _split(sub, encoder(sub), limit, hard, encoder, out, unfit)
        return
    if not devices or len(devices[0].values) <= 1:
        unfit.append((sample, len(data)))
        return
    dev = devices[0]
    keys = sorted(dev.values)
    for lo, hi in _groups(len(keys), lambda i, j: _series_part(batch, sample, dev, keys, i, j), encoder, limit):
        sub = _series_part(batch, sample, dev, keys, lo, hi)
        _split(sub, encoder(sub), limit, hard, encoder, out, unfit)


def _groups(
    n: int, make: Callable[[int, int], Batch], encoder: Callable[[Batch], bytes], limit: int
) -> list[tuple[int, int]]:
    """Consecutive ranges of ``n`` items, each the longest whose part fits (found by bisection), one item
    at least (a single item over the limit is cut further, or found unfit, by the caller)."""
    out = []
    i = 0
    while i < n:
        lo, hi = i + 1, n  # lo fits or is a single item; find the largest j in [lo, hi] that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(encoder(make(i, mid))) <= limit:
                lo = mid
            else:
                hi = mid - 1
        out.append((i, lo))
        i = lo
    return out


def _device_part(batch: Batch, sample: Sample, devices: Sequence[DeviceSample]) -> Batch:
    whole = len(devices) == len(sample.devices)
    name = batch.part if whole else part_name([d.device for d in devices])
    return Batch(
        batch.node, batch.boot, (Sample(sample.seq, sample.timestamp, tuple(devices)),), batch.summary_ms, name
    )


def _series_part(batch: Batch, sample: Sample, dev: DeviceSample, keys: list[SeriesKey], lo: int, hi: int) -> Batch:
    chosen = keys[lo:hi]
    values = {k: dev.values[k] for k in chosen}
    info = dev.info if lo == 0 else {}  # the identity strings travel once, with the first part
    part = DeviceSample(dev.device, dev.up, values, info)
    name = part_name([dev.device], chosen)
    return Batch(batch.node, batch.boot, (Sample(sample.seq, sample.timestamp, (part,)),), batch.summary_ms, name)
