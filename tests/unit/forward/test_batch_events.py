"""What closes the open batch at once (the forwarder's ``has_event``): a change of any value an alert
waits for, on any device, labelled or not; and nothing routine. The six kinds of event are listed here
by hand, so that one dropped from the forwarder's list shows as a failure, not as a shorter list."""

from __future__ import annotations

import pytest

from gpu_exporter import catalog
from gpu_exporter.forward.prepare import has_event
from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey

DEVICES = (DeviceId("0", "GPU-0000"), DeviceId("1", "GPU-1111"), DeviceId("2", "MIG-2222", "1", "0", "1g", "GPU-1111"))

# what each alert of deploy/prometheusrule.yaml waits for, with the labels the catalog gives it
EVENTS: list[SeriesKey] = [
    ("xid_errors", ("79",)),  # an XID
    ("ecc_uncorrected_volatile", ()),  # a double-bit ECC error since the driver loaded
    ("ecc_uncorrected_aggregate", ()),  # ... over the GPU's lifetime
    ("ecc_block_uncorrected", ("sram",)),  # ... in one memory block
    ("remapped_rows_uncorrectable", ()),  # a row remapped for an uncorrectable error
    ("remapped_rows_failure", ()),  # a row remapping that failed: the GPU needs service
]
ROUTINE: list[SeriesKey] = [("power", ()), ("temp_gpu", ()), ("ecc_corrected_volatile", ()), ("utilization", ())]


def _sample(seq: int, changed: SeriesKey | None = None, on: int = 1) -> Sample:
    devices = []
    for i, device in enumerate(DEVICES):
        values: dict[SeriesKey, float] = {series: 0.0 for series in EVENTS + ROUTINE}
        values[("power", ())] = 100.0 + seq  # routine readings move every sample
        if changed is not None and i == on:
            values[changed] = values.get(changed, 0.0) + 1.0
        devices.append(DeviceSample(device, True, values, {}))
    return Sample(seq, 1000.0 + seq, tuple(devices))


def test_the_events_are_catalog_series_with_their_labels() -> None:
    for key, labels in EVENTS + ROUTINE:
        assert len(catalog.by_key(key).labels) == len(labels), key


@pytest.mark.parametrize("on", [0, 1, 2], ids=["first-gpu", "second-gpu", "mig-instance"])
@pytest.mark.parametrize("series", EVENTS, ids=[key for key, _ in EVENTS])
def test_a_change_of_each_event_series_on_any_device_closes_the_batch(series: SeriesKey, on: int) -> None:
    assert has_event(_sample(1), _sample(2, series, on))


@pytest.mark.parametrize("series", ROUTINE, ids=[key for key, _ in ROUTINE])
def test_routine_readings_do_not(series: SeriesKey) -> None:
    assert not has_event(_sample(1), _sample(2, series))
    assert not has_event(_sample(1), _sample(2))


def test_a_new_label_value_of_an_event_series_closes_it_too() -> None:
    """XID 48 for the first time: a series that was not in the previous sample at all."""
    before = _sample(1)
    after = _sample(2, ("xid_errors", ("48",)))
    assert ("xid_errors", ("48",)) not in before.devices[1].values
    assert has_event(before, after)
