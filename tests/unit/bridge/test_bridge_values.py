"""What the bridge writes of values and labels no GPU reports (issue 20): NaN and ±Inf dropped, counters
that go backwards within a boot refused and a reset across boots accepted, gpu_info's identity labels
limited in number, name and reservation. Each refusal is counted by node and reason.

The bridge's real writer path (``Bridge.process``) writes to a receiver that records every request."""

from __future__ import annotations

import math
import time

from gpu_exporter.bridge.labels import MAX_INFO_LABELS, MAX_LABELS
from gpu_exporter.bridge.service import Received
from gpu_exporter.bridge.values import RESET_AFTER
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch
from tests.support.bridge_attacks import info_flood, local_bridge, message, value
from tests.support.bridge_helpers import ScriptedReceiver

NODE = "edge-v"
DEVICE = DeviceId("0", "GPU-v-0")


def _ok(n: int) -> tuple[int, bytes, dict[str, str]]:
    return 204, b"", {}


def _batch(boot: str, seqs: list[int], t0: float, **columns: list[float]) -> Batch:
    """One device; each keyword a catalog key with one value per sample."""
    samples = []
    for i, seq in enumerate(seqs):
        values = {(key, ()): col[i] for key, col in columns.items()}
        samples.append(Sample(seq, t0 + 5 * i, (DeviceSample(DEVICE, True, values, {}),)))
    return Batch(NODE, boot, tuple(samples))


def _points(rx: ScriptedReceiver, name: str) -> list[tuple[int, float]]:
    return sorted(p for r in rx.requests for labels, points in r.series if ("__name__", name) in labels for p in points)


def _values(rx: ScriptedReceiver, name: str) -> list[float]:
    return [v for _, v in _points(rx, name)]


def test_nan_inf_and_negative_counters_are_dropped_and_counted() -> None:
    t0 = time.time() - 100
    batch = _batch(
        "b1",
        [1, 2, 3, 4],
        t0,
        temp_gpu=[40.0, math.nan, math.inf, 42.0],
        power=[-math.inf] * 4,
        energy=[10.0, 20.0, -5.0, 30.0],
    )
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url)
        bridge.process([message(batch)])
    assert _values(rx, "gpu_temperature_celsius") == [40.0, 42.0]
    assert _values(rx, "gpu_power_watts") == []
    assert _values(rx, "gpu_energy_joules_total") == [10.0, 20.0, 30.0]
    assert all(math.isfinite(v) for r in rx.requests for _, points in r.series for _, v in points)
    dropped = "gpu_exporter_bridge_values_dropped_total"
    assert value(registry, dropped, node=NODE, reason="nan") == 1
    assert value(registry, dropped, node=NODE, reason="inf") == 1 + 4
    assert value(registry, dropped, node=NODE, reason="negative_counter") == 1


def test_a_counter_never_goes_back_within_a_boot_a_backlog_is_not_refused_and_a_new_boot_starts_afresh() -> None:
    t0 = time.time() - 3600
    fresh = [
        _batch("b1", [11, 12, 13], t0 + 600, energy=[100.0, 200.0, 300.0]),
        _batch("b1", [14, 15, 16], t0 + 615, energy=[250.0, 260.0, 400.0]),  # back below 300: refused
        _batch("b1", [17, 18, 19], t0 + 630, energy=[410.0, 405.0, 420.0]),  # 405 < 410: refused
    ]
    backlog = _batch("b1", [1, 2, 3], t0, energy=[10.0, 20.0, 30.0])  # older samples, sent after the fresh ones
    restarted = _batch("b2", [1, 2, 3], t0 + 700, energy=[5.0, 6.0, 7.0])  # a new boot: reset accepted
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url)
        for mid, b in enumerate([*fresh, backlog, restarted], 1):
            bridge.process([message(b, mid)])
    # in time order: the backlog, the first boot's rising values, the second boot from its own start
    assert _values(rx, "gpu_energy_joules_total") == [10, 20, 30, 100, 200, 300, 400, 410, 420, 5, 6, 7]
    assert value(registry, "gpu_exporter_bridge_values_dropped_total", node=NODE, reason="counter_backwards") == 3


def test_a_counter_that_stays_below_its_mark_is_taken_as_a_reset_after_a_few_batches() -> None:
    t0 = time.time() - 3600
    batches = [_batch("b1", [1, 2], t0, energy=[1000.0, 1100.0])]
    level = 1.0
    for k in range(RESET_AFTER + 1):  # a GPU reset: NVML's counter starts again near zero and climbs
        batches.append(_batch("b1", [3 + 2 * k, 4 + 2 * k], t0 + 60 + 10 * k, energy=[level, level + 1]))
        level += 2
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url)
        for mid, b in enumerate(batches, 1):
            bridge.process([message(b, mid)])
    refused = 2 * (RESET_AFTER - 1)  # the batches before the reset was believed
    written = _values(rx, "gpu_energy_joules_total")
    assert written == [1000.0, 1100.0] + [float(v) for v in range(1 + refused, int(level))]
    assert value(registry, "gpu_exporter_bridge_values_dropped_total", node=NODE, reason="counter_backwards") == refused


def test_gpu_info_keeps_valid_unreserved_names_up_to_the_cap_and_counts_the_rest() -> None:
    info = {f"key_{i:02d}": f"v{i}" for i in range(40)}
    info.update({"__tmp": "x", "bad-name": "x", "n" * 200: "x", "uuid": "forged", "node": "edge-other", "a_empty": ""})
    device = DeviceSample(DEVICE, True, {("temp_gpu", ()): 50.0}, info)
    batch = Batch(NODE, "b1", (Sample(1, time.time() - 10, (device,)),))
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url)
        bridge.process([message(batch)])
    (labels,) = [dict(lbl) for r in rx.requests for lbl, _ in r.series if ("__name__", "gpu_info") in lbl]
    assert labels["uuid"] == DEVICE.uuid and labels["node"] == NODE  # never the payload's
    assert sorted(k for k in labels if k.startswith("key_")) == [f"key_{i:02d}" for i in range(MAX_INFO_LABELS)]
    assert not {"__tmp", "bad-name", "a_empty"} & labels.keys()
    assert len(labels) == MAX_INFO_LABELS + 4  # __name__, gpu, uuid, node
    dropped = "gpu_exporter_bridge_labels_dropped_total"
    assert value(registry, dropped, node=NODE, reason="reserved") == 3
    assert value(registry, dropped, node=NODE, reason="invalid_name") == 1
    assert value(registry, dropped, node=NODE, reason="name_too_long") == 1
    assert value(registry, dropped, node=NODE, reason="too_many") == 40 - MAX_INFO_LABELS


def test_no_series_is_written_with_more_than_64_labels_whatever_arrives() -> None:
    t = time.time() - 10
    with ScriptedReceiver(_ok) as rx:
        bridge, registry = local_bridge(rx.url)
        for i in range(3):
            node = f"edge-info-{i}"
            payload = info_flood(node, t, keys=3000, value_len=1000, noise=True)  # 3 MB: within the payload limit
            bridge.process([Received(i + 1, 1, f"gpu-exporter/{node}/batch", payload)])
    widths = [len(labels) for r in rx.requests for labels, _ in r.series]
    assert widths and max(widths) <= MAX_LABELS
    too_many = value(registry, "gpu_exporter_bridge_labels_dropped_total", node="edge-info-0", reason="too_many")
    assert too_many == 3000 - MAX_INFO_LABELS
