"""What the agent serves and sends is bounded: info keys, label names and values; NaN and ±Inf dropped
and counted; a counter that goes backwards sent and counted. On the pure function, and end to end: a
Jetson sysfs tree whose device tree holds a 4,000-character model name and serial, through the real
agent to its page and to the batches a real Mosquitto delivers."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry

from gpu_exporter.limits import MAX_INFO_KEYS, MAX_VALUE, SampleBounds, bound_value
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from tests.support import paths, promtool_check
from tests.support.agent_proc import Proc
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)

FIXTURES = paths.FIXTURES


def _sample(seq: int, values: dict[tuple[str, tuple[str, ...]], float], info: dict[str, str]) -> Sample:
    device = DeviceSample(DeviceId("0", "GPU-0"), True, values, info)
    return Sample(seq, 1_700_000_000.0 + seq, (device,))


def _counts(bounds: SampleBounds) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(bounds)
    out = {}
    for family in registry.collect():
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_info_keys_are_capped_and_reserved_or_invalid_names_never_produced() -> None:
    info = {f"k{i:02d}": "v" for i in range(40)}
    info |= {"__tmp": "x", "gpu": "9", "node": "other", "bad-name": "x", "name": "A100", "é": "x"}
    bounds = SampleBounds()
    out = bounds.apply(_sample(1, {}, info)).devices[0].info
    assert "__tmp" not in out and "gpu" not in out and "node" not in out and "bad-name" not in out
    assert "é" not in out and len(out) == MAX_INFO_KEYS and "name" in out
    counts = _counts(bounds)
    assert counts["gpu_exporter_labels_limited_total{reason=reserved}"] == 3
    assert counts["gpu_exporter_labels_limited_total{reason=name}"] == 2
    assert counts["gpu_exporter_labels_limited_total{reason=info_keys}"] == 41 - MAX_INFO_KEYS
    again = bounds.apply(_sample(2, {}, info)).devices[0].info
    assert again == out  # the same keys every sample: no series comes and goes


def test_a_long_value_is_cut_with_a_hash_so_two_long_values_stay_two() -> None:
    a, b = "x" * 300 + "a", "x" * 300 + "b"
    assert bound_value("short") == "short"
    assert len(bound_value(a).encode()) <= MAX_VALUE and bound_value(a) != bound_value(b)
    cut = bound_value("é" * 200)  # 400 bytes: cut on a character boundary
    assert len(cut.encode()) <= MAX_VALUE and cut.startswith("é" * 10) and "\ufffd" not in cut
    assert bound_value("\udcff") == "?"  # a lone surrogate is no UTF-8


def test_values_of_few_characters_but_many_bytes_are_cut_in_every_label_of_every_sample() -> None:
    """The bound is in bytes of UTF-8: 100 emoji are 100 characters but 400 bytes, in a device label, a
    series' label or an info value, on the first sample and on those after (once the keys are known)."""
    long = "\U0001f525" * 100
    bounds = SampleBounds()
    for seq in (1, 2):
        device = DeviceSample(DeviceId("0", "GPU-" + long), True, {("xid_errors", (long,)): 1.0}, {"name": long})
        out = bounds.apply(Sample(seq, 1_700_000_000.0 + seq, (device,))).devices[0]
        ((_, (xid,)),) = out.values
        for text in (out.device.uuid, xid, out.info["name"]):
            assert len(text.encode()) <= MAX_VALUE and "\U0001f525" * 10 in text
    assert _counts(bounds)["gpu_exporter_labels_limited_total{reason=value_length}"] == 6


def test_nan_and_inf_are_dropped_and_counted_and_a_counter_going_back_is_sent_and_counted() -> None:
    bounds = SampleBounds()
    power, energy = ("power", ()), ("energy", ())
    first = bounds.apply(_sample(1, {power: 250.0, energy: 1000.0}, {}))
    assert dict(first.devices[0].values) == {power: 250.0, energy: 1000.0}
    second = bounds.apply(_sample(2, {power: float("nan"), energy: float("inf")}, {}))
    assert dict(second.devices[0].values) == {}  # absent, as an unsupported reading
    third = bounds.apply(_sample(3, {power: float("-inf"), energy: 5.0}, {}))  # the driver restarted
    assert dict(third.devices[0].values) == {energy: 5.0}
    counts = _counts(bounds)
    assert counts["gpu_exporter_values_dropped_total{metric=power,reason=nan}"] == 1
    assert counts["gpu_exporter_values_dropped_total{metric=power,reason=inf}"] == 1
    assert counts["gpu_exporter_values_dropped_total{metric=energy,reason=inf}"] == 1
    assert counts["gpu_exporter_counter_resets_total{metric=energy}"] == 1


def test_a_counter_going_back_is_counted_whatever_came_between() -> None:
    """A counter is compared with its last value however the samples between differed: the same readings
    (the common case), a reading gone or back, a value dropped, several counters going back at once."""
    bounds = SampleBounds()
    energy, replay, power, xid = ("energy", ()), ("pcie_replay", ()), ("power", ()), ("xid_errors", ("79",))
    steps: list[dict[tuple[str, tuple[str, ...]], float]] = [
        {power: 1.0, energy: 100.0, replay: 7.0, xid: 0.0},
        {power: 2.0, energy: 110.0, replay: 7.0, xid: 0.0},  # the same readings, the counters up
        {power: 2.0, energy: 120.0},  # two readings gone
        {power: 3.0, energy: 115.0, replay: 6.0, xid: 0.0},  # back, lower than when they left: 3 resets
        {power: float("nan"), energy: 116.0, replay: 6.0, xid: 0.0},  # a value dropped
        {power: 3.0, energy: 90.0, replay: 5.0, xid: 0.0},  # 2 resets
        {power: 3.0, energy: 95.0, replay: 5.0, xid: 0.0},
    ]
    for seq, values in enumerate(steps, 1):
        assert bounds.apply(_sample(seq, values, {})).devices[0].values == {k: v for k, v in values.items() if v == v}
    counts = _counts(bounds)
    assert counts["gpu_exporter_counter_resets_total{metric=energy}"] == 2
    assert counts["gpu_exporter_counter_resets_total{metric=pcie_replay}"] == 2
    assert "gpu_exporter_counter_resets_total{metric=xid_errors}" not in counts


def test_a_sample_within_bounds_is_passed_on_untouched() -> None:
    bounds = SampleBounds()
    sample = _sample(1, {("power", ()): 1.0}, {"name": "A100", "serial": "123"})
    assert bounds.apply(sample) is sample


def _jetson_tree(tmp_path: Path) -> Path:
    root = tmp_path / "orin"
    shutil.copytree(FIXTURES / "jetson" / "orin-jp6", root, symlinks=True)
    base = root / "sys" / "firmware" / "devicetree" / "base"
    base.mkdir(parents=True, exist_ok=True)
    (base / "model").write_text("M" * 4000 + "\0")
    (base / "serial-number").write_text("S" * 3000 + "\0")
    return root


def test_the_agent_serves_and_sends_bounded_labels_from_a_hostile_device_tree(tmp_path: Path, broker: Broker) -> None:
    root = _jetson_tree(tmp_path)
    with Collector(broker) as collector:
        proc = Proc(
            tmp_path,
            "--gpu-vendor=jetson",
            f"--path.sysfs={root / 'sys'}",
            f"--path.procfs={root / 'proc'}",
            "--gpu-metrics-collection-interval=200ms",
            "--node-name=edge-1",
            f"--mqtt.url={broker.url}",
            "--mqtt.batch-interval=200ms",
            f"--spool.dir={tmp_path / 'spool'}",
        ).start()
        try:
            page = proc.scrape()
            assert wait_until(lambda: collector.batches, 30), proc.log()[-2000:]
        finally:
            assert proc.stop() == 0
    values = re.findall(r'="((?:[^"\\]|\\.)*)"', page)
    assert values and max(len(v.encode()) for v in values) <= MAX_VALUE
    info = [line for line in page.splitlines() if line.startswith("gpu_info{")]
    assert len(info) == 1 and 'name="MMMM' in info[0] and "~" in info[0]
    assert re.search(r'gpu_exporter_labels_limited_total\{reason="value_length"\} [1-9]', page)
    promtool_check(page)
    device = collector.batches[0].samples[0].devices[0]
    assert device.device.uuid == bound_value("jetson-" + "S" * 3000)  # the page's uuid label, the same
    served = re.search(r'name="([^"]*)"', info[0])
    assert served is not None and device.info["name"] == served.group(1)  # what is served is what is sent
    assert all(len(v.encode()) <= MAX_VALUE for v in device.info.values())
