"""Summaries on a weak link, piece by piece: what a summary holds, how it travels, how the bridge writes
it, and what the link meter concludes from PUBACKs (the forwarder's timing is passed in by hand here;
tests/integration/test_forward_weak_link.py runs the whole path through a slow link)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import jsonschema
import pytest

from gpu_exporter.bridge import summaries
from gpu_exporter.bridge.convert import Converter
from gpu_exporter.forward import tail
from gpu_exporter.forward.adaptive import COARSE_SECONDS, Adaptive
from gpu_exporter.forward.link_meter import LinkMeter
from gpu_exporter.forward.spool_index import Entry
from gpu_exporter.forward.summary import STATS, encode_summary, merge, summarize
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, PayloadError, columns, decode, encode, schema, to_document
from tests.support.bridge_helpers import fields

GPU = DeviceId("0", "GPU-0")
T0 = 1_764_000_000.0


def decode_labels(encoded: bytes) -> list[tuple[str, str]]:
    out = []
    for _, _, part in fields(encoded):
        kv = {k: v for k, _, v in fields(part)}  # type: ignore[arg-type]
        out.append((kv[1].decode(), kv[2].decode()))  # type: ignore[union-attr]
    return out


def entry(seq: int, size: int) -> Entry:
    """A spooled batch, as the spool describes it (the forwarder tells the adaptive part its entries)."""
    return Entry(seq, 0, size, seq, seq, 1)


def sample(seq: int, temp: float, energy: float, up: bool = True) -> Sample:
    values = {("temp_gpu", ()): temp, ("energy", ()): energy, ("power_limit", ()): 700.0}
    return Sample(seq, T0 + seq, (DeviceSample(GPU, up, values if up else {}, {"name": "sim"}),))


def window() -> list[Sample]:
    """Ten samples at 60 degrees with a 3-sample spike to 95 in the middle; energy climbs 100 J a sample."""
    return [sample(s, 95.0 if 4 <= s <= 6 else 60.0, 1000.0 + 100 * s) for s in range(1, 11)]


def test_a_summary_keeps_the_spike_as_its_max_and_the_counter_exactly() -> None:
    point = summarize(window())
    values = point.devices[0].values
    assert values[("temp_gpu:max", ())] == 95.0
    assert values[("temp_gpu:min", ())] == 60.0
    assert values[("temp_gpu:mean", ())] == pytest.approx((7 * 60 + 3 * 95) / 10)
    assert values[("temp_gpu:last", ())] == 60.0
    assert values[("energy:last", ())] == 2000.0  # a counter: its last value, exactly, and nothing else
    assert ("energy:max", ()) not in values and ("energy:mean", ()) not in values
    assert (point.seq, point.timestamp) == (10, T0 + 10)  # the window's last sample


def test_a_device_down_for_part_of_the_window_is_summarised_from_what_it_answered() -> None:
    samples = [*window()[:5], sample(6, 0, 0, up=False), *window()[6:]]
    values = summarize(samples).devices[0].values
    assert values[("temp_gpu:min", ())] == 60.0  # the sample it did not answer adds no zero


def test_a_summary_batch_travels_and_is_told_apart_from_full_resolution() -> None:
    data = encode_summary("node-a", "boot-1", [summarize(window())], 10.0)
    batch = decode(data)
    assert batch.summary_ms == 10_000
    assert batch.samples[0].devices[0].values[("temp_gpu:max", ())] == 95.0
    doc = to_document(batch)
    jsonschema.validate(doc, schema())
    assert columns.read(data).summary_ms == 10_000
    raw = decode(encode(Batch("node-a", "boot-1", tuple(window()))))
    assert raw.summary_ms == 0 and "summary_ms" not in to_document(raw)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("summary_ms"), "invalid metric key"),  # stat keys only in a summary batch
        (lambda d: d.update(summary_ms=0), "summary_ms must be"),
        (lambda d: d.update(summary_ms="10"), "summary_ms must be an integer"),
        (lambda d: d["metrics"][0].__setitem__(0, "temp_gpu:median"), "invalid metric key"),
        (lambda d: d.update(version=2, devices=[]), "unknown field 'summary_ms'"),
    ],
)
def test_malformed_summaries_are_rejected_by_decoder_bridge_and_schema(change: Any, message: str) -> None:
    doc = to_document(decode(encode_summary("node-a", "boot-1", [summarize(window())], 10.0)))
    change(doc)
    text = json.dumps(doc).encode()
    with pytest.raises(PayloadError, match=message):
        decode(text)
    with pytest.raises(PayloadError, match=message):
        columns.read(text)
    if doc.get("version") == 3:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, schema())


def test_the_bridge_writes_summaries_as_their_own_series_beside_the_raw_ones() -> None:
    summary = summaries.complete(columns.read(encode_summary("node-a", "boot-1", [summarize(window())], 10.0)))
    raw = columns.read(encode(Batch("node-a", "boot-1", tuple(window()))))
    converter = Converter()
    written: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, float]]] = {}
    for batch in (summary, raw):  # the summary first, as on a weak link; raw at the same timestamps later
        for series in converter.convert([(batch, None)]).series:
            labels = decode_labels(series.encoded_labels)
            name = dict(labels)["__name__"]
            key = (name, tuple(sorted((k, v) for k, v in labels if k != "__name__")))
            assert key not in written, f"{name} written twice: summaries must not collide with raw series"
            written[key] = list(zip(series.timestamps, series.values, strict=True))
    names = {name for name, _ in written}
    assert {
        "gpu_temperature_celsius_max",
        "gpu_temperature_celsius_min",
        "gpu_temperature_celsius_mean",
        "gpu_temperature_celsius_last",
        "gpu_energy_joules_total_last",
        "gpu_temperature_celsius",
        "gpu_up",
    } <= names
    assert "gpu_up_last" not in names and "gpu_energy_joules_total_max" not in names
    limit = {name: v for (name, _), v in written.items() if name.startswith("gpu_power_limit_watts_")}
    assert limit == {f"gpu_power_limit_watts_{stat}": [(round((T0 + 10) * 1000), 700.0)] for stat in STATS}
    (peak,) = [v for (name, _), v in written.items() if name == "gpu_temperature_celsius_max"]
    assert peak == [(round((T0 + 10) * 1000), 95.0)]


# -------------------------------------------------------------------------------------- link meter


def test_pipelined_pubacks_measure_what_the_link_carries() -> None:
    meter = LinkMeter(None)
    now = 0.0
    for mid in range(1, 5):  # four batches of 1000 bytes in flight at once
        meter.sent(mid, 1000, now)
    for mid in range(1, 5):  # a 500 B/s link: one PUBACK every 2 s
        now += 2.0
        meter.acked(mid, now, latency=0.1)
    assert meter.capacity == pytest.approx(500, rel=0.05)
    assert meter.rtt > 2.0


def test_a_batch_sent_alone_is_measured_without_the_round_trip() -> None:
    meter = LinkMeter(None)
    meter.sent(1, 2000, 10.0)
    meter.acked(1, 14.5, latency=0.5)  # 0.5 s latency, 4 s on a 500 B/s link
    assert meter.capacity == pytest.approx(500)


def test_a_puback_that_took_only_the_latency_measures_nothing() -> None:
    meter = LinkMeter(None)
    meter.sent(1, 200, 0.0)
    meter.acked(1, 0.31, latency=0.3)  # a fast link far away: 200 B in 0.01 s is noise, not a rate
    assert meter.capacity == 0 and not meter.weak()


def test_full_resolution_is_weak_when_it_needs_more_than_the_link_or_the_cap() -> None:
    meter = LinkMeter(None)
    meter.produced(9000, 30.0)  # 300 B/s of full resolution
    assert not meter.weak()  # the link is not measured yet
    meter.sent(1, 1000, 0.0)
    meter.acked(1, 5.0, latency=0.0)  # 200 B/s
    assert meter.weak()
    capped = LinkMeter(None, max_rate=1000)
    capped.produced(9000, 30.0)
    assert not capped.weak()
    capped.max_rate = 250
    assert capped.weak()


def test_max_rate_spaces_publishes_by_their_size() -> None:
    meter = LinkMeter(None, max_rate=100)
    assert meter.allowed(0.0)
    meter.sent(1, 300, 0.0)  # three seconds' worth, of which the bucket held one
    assert not meter.allowed(1.0) and not meter.allowed(1.9)
    assert meter.allowed(2.1)
    assert LinkMeter(None).allowed(0.0)  # no cap


def link_of(rate: float) -> LinkMeter:
    """A meter that measured ``rate`` bytes per second (one 1000-byte PUBLISH acknowledged)."""
    meter = LinkMeter(None)
    meter.sent(1, 1000, 0.0)
    meter.acked(1, 1000 / rate, latency=0.0)
    return meter


def gpus(seq: int, n: int = 8) -> Sample:
    """``n`` GPUs whose gauges move every second and whose counters climb (NVLink bytes, energy)."""
    devices = []
    for g in range(n):
        values = {("temp_gpu", ()): 50.0 + (seq * 7 + g) % 23, ("power", ()): 300.0 + (seq * 13 + g) % 97}
        values[("energy", ())] = 1000.0 * seq + g
        for link in range(4):
            values[("nvlink_tx", (str(link),))] = 4096.0 * seq * (link + 1) + g
        values[("xid_errors", ("79",))] = 0.0
        devices.append(DeviceSample(DeviceId(str(g), f"GPU-{g}"), True, values, {"name": "sim"}))
    return Sample(seq, T0 + seq, tuple(devices))


def run_weak(adaptive: Adaptive, seconds: int, rate: float) -> list[tuple[Sample, float, float]]:
    """Samples a second apart into a weak forwarder's adaptive part (the first batch of 10 starts the
    window), on a link that takes a summary in its size over ``rate`` seconds: the fresh summaries made,
    as (point, window seconds, time it was made)."""
    adaptive.rate = rate  # what earlier summaries measured, end to end
    first = [gpus(s) for s in range(1, 11)]
    assert adaptive.closed(first, [entry(1, 9000)], 10.0, connected=True)  # weak: the raw batch waits
    made: list[tuple[Sample, float, float]] = []
    arrives = -1.0
    for seq in range(11, seconds + 1):
        now = T0 + seq
        if adaptive._delivery is not None and now >= arrives:
            adaptive._delivery = None  # its last part acknowledged
        adaptive.add(gpus(seq))
        if adaptive._pending is not None:
            point, span, _ = adaptive._pending
            made.append((point, span, now))
            size = len(encode_summary("node-a", "boot-1", [point], span))
            adaptive._pending, adaptive._delivery = None, [now, size, set(), True]  # on the link
            arrives = now + size / rate
    return made


@pytest.mark.parametrize("rate", [400.0, 40.0, 1.5])
def test_a_window_closes_when_the_link_has_taken_the_last_summary_and_not_before(rate: float) -> None:
    """Windows of a batch interval where the link takes a summary sooner, as long as the link takes one
    where it is slower (no cap of 16 intervals), closed at the sample where they are due."""
    meter = link_of(rate)
    meter.produced(9000, 10.0)  # full resolution: 900 B/s, more than any of these links
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    made = run_weak(adaptive, 1200 if rate > 2 else 4000, rate)
    assert len(made) >= 3, made
    for (point, _, _), (_, span, _) in itertools.pairwise(made):
        took = len(encode_summary("node-a", "boot-1", [point], 10.0)) / rate
        assert max(10.0, took) - 1.0 <= span <= max(10.0, took) + 2.0  # the next window: until the link took it
    if rate == 1.5:
        assert max(span for _, span, _ in made) > 16 * 10.0  # past the former cap of 16 batch intervals
    if rate == 400.0:
        assert adaptive.every == 1  # the whole summary fits within two batch intervals: all counters go
        assert all(("energy:last", ()) in d.values for p, _, _ in made for d in p.devices)
        assert {span for _, span, _ in made[1:]} == {10.0}


def test_on_a_link_too_thin_for_whole_summaries_counters_go_in_turns_and_alerts_in_every_window() -> None:
    meter = link_of(20.0)
    meter.produced(9000, 10.0)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    made = run_weak(adaptive, 2000, 20.0)
    assert adaptive.every > 1
    k = adaptive.every
    tail_points = [p for p, _, _ in made[-2 * k :]]
    for point in tail_points:
        with_counters = [d for d in point.devices if ("energy:last", ()) in d.values]
        assert len(with_counters) <= -(-8 // k)  # a share of the devices only
        for dev in point.devices:  # gauges, and the counters an alert waits for, in every window
            assert ("temp_gpu:max", ()) in dev.values and ("xid_errors:last", ("79",)) in dev.values
    covered = {d.device.uuid for p in tail_points for d in p.devices if ("energy:last", ()) in d.values}
    assert covered == {f"GPU-{g}" for g in range(8)}  # every device's counters within k windows
    lean = len(encode_summary("node-a", "boot-1", [tail_points[-1]], 10.0))
    whole = summarize([gpus(s) for s in range(1, 30)])
    assert lean < 0.9 * len(encode_summary("node-a", "boot-1", [whole], 10.0))  # and it buys bytes


def test_tail_shows_a_summary_under_the_names_the_bridge_writes() -> None:
    (line,) = tail.lines(decode(encode_summary("node-a", "boot-1", [summarize(window())], 10.0)))
    assert line["summary_ms"] == 10_000
    assert line["values"]['gpu_temperature_celsius_max{sensor="gpu"}'] == 95.0
    assert line["values"]["gpu_energy_joules_total_last"] == 2000.0


def test_merged_windows_keep_the_extremes_and_weigh_the_means_by_window() -> None:
    first = summarize(window())  # 60..95, mean 70.5, over 10 s
    calm = summarize([sample(s, 50.0 + s % 2, 1000.0 + 100 * s) for s in range(11, 41)])  # 50..51 over 30 s
    point, span = merge([(first, 10.0), (calm, 30.0)])
    values = point.devices[0].values
    assert span == 40.0 and point.seq == 40
    assert values[("temp_gpu:max", ())] == 95.0 and values[("temp_gpu:min", ())] == 50.0
    calm_mean = calm.devices[0].values[("temp_gpu:mean", ())]
    assert values[("temp_gpu:mean", ())] == pytest.approx((70.5 * 10 + calm_mean * 30) / 40, rel=1e-4)
    assert values[("energy:last", ())] == 5000.0 and ("energy:max", ()) not in values


def test_a_moving_gauge_is_summarised_to_the_value_digits_and_what_held_still_exactly() -> None:
    """--mqtt.value-digits applies to a moving gauge's four figures, bytes of memory included (a tenth of
    a summary of 8 GPUs); a limit that held still and a counter stay exact, and 0 keeps every figure exact."""

    def at(seq: int) -> Sample:
        values = {
            ("memory_used", ()): 63_571_116_032.0 + 1_048_577 * seq,  # bytes: an integer gauge that moves
            ("memory_total", ()): 85_899_345_920.0,  # held still
            ("energy", ()): 1_234_567_891.0 + 100 * seq,  # a counter
        }
        return Sample(seq, T0 + seq, (DeviceSample(GPU, True, values, {}),))

    samples = [at(s) for s in range(1, 11)]
    short = summarize(samples, digits=4).devices[0].values
    assert short[("memory_used:min", ())] == 63_570_000_000.0
    assert short[("memory_used:max", ())] == short[("memory_used:last", ())] == 63_580_000_000.0
    assert short[("memory_used:mean", ())] == 63_580_000_000.0
    assert short[("memory_total:last", ())] == 85_899_345_920.0 and ("memory_total:min", ()) not in short
    assert short[("energy:last", ())] == 1_234_568_891.0
    exact = summarize(samples).devices[0].values
    assert exact[("memory_used:min", ())] == 63_571_116_032.0 + 1_048_577
    assert exact[("memory_used:last", ())] == 63_571_116_032.0 + 10 * 1_048_577
    assert exact[("memory_used:mean", ())] == 63_577_000_000.0  # 5 digits, as before
    first, second = summarize(samples[:5], digits=4), summarize(samples[5:], digits=4)
    merged = merge([(first, 5.0), (second, 5.0)], 3)[0].devices[0].values
    assert merged[("memory_used:mean", ())] == 63_600_000_000.0


def test_the_summaries_of_a_long_backlog_fit_the_link_in_coarse_seconds() -> None:
    meter = LinkMeter(None, max_rate=20)  # a 20 B/s link
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    points = [(summarize([sample(s, 60.0 + s % 7, float(s))]), 10.0) for s in range(1, 2001)]
    coarse = adaptive._coarsen("node-a", "boot-1", points, meter.budget())
    assert 1 < len(coarse) < len(points)
    size = sum(
        len(encode_summary("node-a", "boot-1", [p for p, _ in coarse[i : i + 64]], 10.0))
        for i in range(0, len(coarse), 64)
    )
    assert size <= 20 * COARSE_SECONDS * 1.5
    assert sum(span for _, span in coarse) == pytest.approx(20_000.0)


def test_on_a_weak_link_a_raw_batch_goes_only_if_acknowledged_before_the_next_summary() -> None:
    meter = LinkMeter(None)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    meter.sent(1, 1000, 0.0)
    meter.acked(1, 5.0, latency=0.0)  # 200 B/s
    assert adaptive.closed([sample(1, 60.0, 1.0)], [entry(1, 3000)], 10.0, connected=True)  # 300 B/s: weak
    assert not adaptive.raw_allowed(3000, 6.0, until_next=9.0)  # 15 s at 200 B/s: past the next summary
    assert adaptive.raw_allowed(1000, 6.0, until_next=9.0)  # 5 s: it fits
    meter.sent(2, 1000, 6.0)  # but not behind another one in flight
    assert not adaptive.raw_allowed(1000, 6.0, until_next=9.0)


def test_batches_closed_during_an_outage_are_summarised_on_reconnect_without_reading_the_spool() -> None:
    meter = LinkMeter(None, max_rate=10)  # a thin link: the backlog takes long
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    spooled = []
    for b in range(4):  # four batches while the broker was away, the spike in the second
        samples = [sample(s, 95.0 if s == 15 else 60.0, float(s)) for s in range(b * 10 + 1, b * 10 + 11)]
        spooled.append(entry(b * 10 + 1, 5000))
        assert not adaptive.closed(samples, [spooled[-1]], 10.0, connected=False)

    def unread(e: Entry) -> bytes:
        raise AssertionError("read from the spool")

    assert adaptive.backlog(spooled, unread) == 4
    (data,) = adaptive.queue
    batch = decode(data)
    peaks = [s.devices[0].values.get(("temp_gpu:max", ())) for s in batch.samples]
    assert peaks == [None, 95.0, None, None]  # windows that held still send their last value only
    assert [s.seq for s in batch.samples] == [10, 20, 30, 40]


def measured(packets: list[tuple[int, float]], need: float) -> LinkMeter:
    """A meter that saw each of ``packets`` (bytes, at B/s) go alone, in order, while full resolution
    needed ``need`` B/s."""
    meter = LinkMeter(None)
    meter.produced(round(need * 10), 10.0)
    now = 0.0
    for mid, (size, rate) in enumerate(packets, 1):
        meter.sent(mid, size, now)
        now += size / rate
        meter.acked(mid, now, latency=0.0)
        now += 1.0  # idle until the next batch
    return meter


def test_a_halving_that_the_link_then_shows_was_not_needed_is_undone() -> None:
    """A connection lost with packets in flight halves the link's figure: a guess. When the next packet,
    alone on the link, comes back within the latency, nothing queued: the halving goes. Before, summaries
    alone, each on an idle link and measuring nothing, kept the halved figure for good on a link where full
    resolution needs over half of it: summarising never ended and the raw backlog never went (seen with
    both cores busy, 3 minutes of summaries and not one raw batch after an outage)."""
    meter = measured([(8000, 8000.0)] * 4, need=4500.0)
    assert meter.capacity == pytest.approx(8000) and not meter.weak()
    meter.sent(10, 8000, 100.0)
    meter.lost()  # in flight when the connection dropped
    assert meter.capacity == pytest.approx(4000) and meter.weak()
    meter.sent(11, 3600, 200.0)  # a summary alone on the new connection
    meter.acked(11, 200.55, latency=0.5)  # back within the latency
    assert meter.capacity == pytest.approx(8000) and not meter.weak() and meter.floor() == pytest.approx(8000)
    meter.sent(12, 8000, 300.0)
    meter.lost()
    meter.sent(13, 8000, 400.0)
    meter.acked(13, 404.0, latency=0.5)  # measured after the halving: 3.5 s for 8 kB, the link is slower now
    slower = meter.capacity
    assert slower < 4000
    meter.sent(14, 3600, 500.0)
    meter.acked(14, 500.55, latency=0.5)
    assert meter.capacity == slower  # a measurement stands: only a halving is undone


@pytest.mark.parametrize(
    ("packets", "need", "coarse"),
    [
        # a 500 B/s link, then one large packet that rode a token bucket's burst after an idle moment
        ([(2000, 500.0)] * 12 + [(20_000, 40_000.0)], 300.0, True),
        ([(2000, 1000.0)] * 12, 850.0, True),  # full resolution fits, leaving 150 B/s to drain the backlog
        ([(2000, 40_000.0)] * 12, 300.0, False),  # a fast link: it drains within a batch interval, raw
    ],
    ids=["slow-then-fast-once", "little-to-spare", "fast"],
)
def test_a_backlog_goes_coarse_first_when_the_link_takes_long_to_drain_it(
    packets: list[tuple[int, float]], need: float, coarse: bool
) -> None:
    """On reconnect, an 18 kB backlog goes as summaries first when what the link has to spare beside
    fresh full resolution, at the least the link carried lately, takes more than two batch intervals
    for it. One figure that says fast must not send it raw: the outage would stay invisible until the
    backlog had drained."""
    meter = measured(packets, need)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    spooled = []
    for b in range(4):  # four batches closed while the broker was away
        samples = [sample(s, 60.0, float(s)) for s in range(b * 10 + 1, b * 10 + 11)]
        spooled.append(entry(b * 10 + 1, 4500))
        assert not adaptive.closed(samples, [spooled[-1]], 10.0, connected=False)
    made = adaptive.backlog(spooled, lambda e: None)
    assert (made == 4) == coarse, (made, meter.capacity, meter.need)
    assert adaptive.active == coarse


def test_no_raw_batch_goes_ahead_of_a_summary_that_is_due() -> None:
    """On a link slower than a summary per batch interval, each window is past its end by the time the
    link has taken the previous summary: the next one is due with the next sample. A raw batch sent in
    that moment would hold it back (8 s a time at 150 B/s, the cloud's lag that much longer)."""
    meter = link_of(150.0)
    meter.produced(9000, 10.0)
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0)
    adaptive.rate = 150.0
    first = [gpus(s) for s in range(1, 11)]
    assert adaptive.closed(first, [entry(1, 9000)], 10.0, connected=True)
    adaptive.add(gpus(11))
    assert adaptive._pending is not None  # the first window closed
    adaptive._pending, adaptive._delivery = None, [T0 + 11, 2500, {7}, True]  # on the link for 17 s
    for seq in range(12, 29):
        adaptive.add(gpus(seq))
    assert adaptive._pending is None  # past its end, waiting for the link
    now = T0 + 28.5
    assert adaptive.next_due(now) == 0.0
    assert not adaptive.raw_allowed(500, now, adaptive.next_due(now))  # 3 s of the link: not now
    assert adaptive.next_due(T0 + 60) == 10.0  # no sample for a batch interval: sampling paused
    assert adaptive.raw_allowed(500, T0 + 60, adaptive.next_due(T0 + 60))


def _bytes_sample(seq: int) -> Sample:
    """A GPU whose memory in use (bytes, an integer gauge) moves every second, beside a counter."""
    values = {
        ("memory_used", ()): 63_571_116_032.0 + 5_000_000 * seq + 1_048_577 * (seq % 13),
        ("memory_total", ()): 85_899_345_920.0,
        ("energy", ()): 1_234_567_891.0 + 100 * seq,
    }
    return Sample(seq, T0 + seq, (DeviceSample(GPU, True, values, {}),))


def _digits_of(value: float) -> int:
    return len(f"{value:.17g}".split("e")[0].replace(".", "").replace("-", "").strip("0"))


def _moving(batch: Batch) -> list[float]:
    """The figures of the moving gauge (memory in use) in every point of a summary batch."""
    return [
        v for s in batch.samples for d in s.devices for (k, _), v in d.values.items() if k.startswith("memory_used:")
    ]


def test_every_summary_the_forwarder_makes_has_its_moving_gauges_at_the_value_digits() -> None:
    """Fresh windows, summaries made while the broker was away, those of a backlog read back from the
    spool and the wider points a long backlog is merged into: each path summarises on its own, and each
    must round a moving gauge (what a forgotten ``digits`` on one of them would not)."""
    meter = LinkMeter(None, max_rate=10)  # a thin link: the backlog takes long, and goes as summaries
    adaptive = Adaptive("node-a", "boot-1", meter, interval=10.0, digits=4)
    spooled: dict[Entry, bytes] = {}
    for b in range(3):  # batches closed while the broker was away: summarised at once, from memory
        samples = [_bytes_sample(s) for s in range(b * 10 + 1, b * 10 + 11)]
        e = entry(b * 10 + 1, 5000)
        assert not adaptive.closed(samples, [e], 10.0, connected=False)
        spooled[e] = encode(Batch("node-a", "boot-1", tuple(samples)))
    earlier = [_bytes_sample(s) for s in range(31, 41)]  # a batch of an earlier run: read back and summarised
    spooled[entry(31, 5000)] = encode(Batch("node-a", "boot-1", tuple(earlier)))
    assert adaptive.backlog(spooled, lambda e: spooled[e]) > 0
    made = [decode(data) for data in adaptive.queue]
    points = [(p, 10.0) for b in made for p in b.samples]
    made.append(Batch("node-a", "boot-1", (adaptive._coarsen("node-a", "boot-1", points, 0.001)[0][0],), 1))
    fresh = Adaptive("node-a", "boot-1", link_of(20.0), interval=10.0, digits=4)
    fresh.meter.produced(9000, 10.0)
    assert fresh.closed([_bytes_sample(s) for s in range(41, 51)], [entry(41, 9000)], 10.0, connected=True)
    for seq in range(51, 70):
        fresh.add(_bytes_sample(seq))
    assert fresh._pending is not None
    made.append(Batch("node-a", "boot-1", (fresh._pending[0],), 1))
    for batch in made:
        figures = _moving(batch)
        assert figures and all(_digits_of(v) <= 4 for v in figures), figures
        totals = [
            v
            for s in batch.samples
            for d in s.devices
            for (k, _), v in d.values.items()
            if k.startswith("memory_total")
        ]
        assert totals and set(totals) == {85_899_345_920.0}  # held still: exact
