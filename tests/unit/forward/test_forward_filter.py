"""--metrics.include / --metrics.exclude also decide what is shipped over MQTT."""

from __future__ import annotations

from gpu_exporter import catalog
from gpu_exporter.forward.prepare import round_values
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, decode, encode


def sample() -> Sample:
    values = {
        ("power", ()): 345.123456789,
        ("energy", ()): 5_000_000.123456789,
        ("temp_gpu", ()): 51.0,
        ("xid_errors", ("79",)): 1.0,
    }
    return Sample(7, 1_700_000_000.0, (DeviceSample(DeviceId("0", "GPU-a"), True, values, {"name": "H100"}),))


def test_only_included_metrics_are_forwarded() -> None:
    keys = catalog.kept_keys(include="^gpu_(power|energy|xid)", exclude="xid")
    assert keys is not None and "power" in keys and "energy" in keys and "xid_errors" not in keys
    shipped = decode(encode(Batch("edge-1", "boot-1", (round_values(sample(), 6, keys),))))
    [device] = shipped.samples[0].devices
    assert set(device.values) == {("power", ()), ("energy", ())}
    assert device.values[("power", ())] == 345.123  # gauge rounded to 6 significant digits
    assert device.values[("energy", ())] == 5_000_000.123456789  # counters stay exact


def test_no_filter_forwards_everything() -> None:
    assert catalog.kept_keys() is None
    out = round_values(sample(), 0, None)
    assert set(out.devices[0].values) == set(sample().devices[0].values)
