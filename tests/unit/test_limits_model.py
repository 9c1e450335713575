"""The counter-reset watch of ``SampleBounds`` against a plain model (limits.py).

The bounds keep each device's counters in one of two forms (a tuple while its set of readings stays the
same, else one entry per series) and switch between them as readings come, go, turn NaN or carry a
label too long to keep: the model is one dict of last values. For any run of samples, a counter counts
as reset exactly when a finite reading of it is below the last finite one of the same device and series.
"""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpu_exporter.limits import MAX_VALUE, SampleBounds
from gpu_exporter.model import DeviceId, DeviceSample, Sample, SeriesKey

LONG = "x" * (MAX_VALUE + 10)  # a label value the bounds cut (the per-series path)
POOL: list[SeriesKey] = [
    ("energy", ()),
    ("pcie_replay", ()),
    ("nvlink_tx", ("0",)),
    ("nvlink_tx", ("1",)),
    ("xid_errors", (LONG,)),
    ("temp_gpu", ()),  # a gauge: never a reset
]
DEVICES = [DeviceId(str(g), f"GPU-{g}") for g in range(3)]
readings = st.dictionaries(
    st.sampled_from(POOL),
    st.one_of(st.integers(0, 6).map(float), st.just(math.nan), st.just(math.inf)),
    max_size=len(POOL),
)
runs = st.lists(st.lists(st.tuples(st.sampled_from(range(3)), readings), max_size=3), min_size=1, max_size=25)


E, T, X = ("energy", ()), ("temp_gpu", ()), ("xid_errors", (LONG,))


@settings(max_examples=300, deadline=None)
@given(runs)
# the switches between the two forms, pinned: held -> one by one (a NaN; a long label) and back
@example([[(0, {E: 5.0})], [(0, {E: 3.0, T: math.nan})]])
@example([[(0, {E: 5.0})], [(0, {E: 3.0, X: 1.0})]])
@example([[(0, {E: 5.0, T: math.nan})], [(0, {E: 4.0})], [(0, {E: 3.0})]])
@example([[(0, {E: 5.0})], [(0, {E: 6.0, ("pcie_replay", ()): 1.0})], [(0, {E: 2.0})]])
def test_a_counter_counts_as_reset_exactly_when_it_goes_below_its_last_finite_reading(run: list) -> None:
    bounds = SampleBounds()
    last: dict[tuple[str, SeriesKey], float] = {}
    expected: dict[str, int] = {}
    for seq, step in enumerate(run, 1):
        devices = {}
        for g, values in step:
            devices[g] = DeviceSample(DEVICES[g], True, values, {})
        bounds.apply(Sample(seq, 1e9 + seq, tuple(devices.values())))
        for g, dev in devices.items():
            for (key, labels), value in dev.values.items():
                if key == "temp_gpu" or not math.isfinite(value):
                    continue
                slot = (DEVICES[g].uuid, (key, tuple(v[: MAX_VALUE // 4] if len(v) > MAX_VALUE else v for v in labels)))
                before = last.get(slot)
                if before is not None and value < before:
                    expected[key] = expected.get(key, 0) + 1
                last[slot] = value
    assert bounds.resets == expected
