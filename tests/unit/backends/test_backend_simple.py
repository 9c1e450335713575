"""Simple calls written as data (backends/simple.py): the tables are checked against the catalog when they
are built, each distinct call is made once per group, and a call that fails or answers a wrong-shaped
record leaves its values out, counted, while the rest of the device is read.

The AMD backend stands for the vendors here (its rows read fields of records, several rows per call),
against tests/fakes/fake_amdsmi.py; the NVIDIA and Jetson tables run through the same ``read`` and are
covered by their own tests and golden pages.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpu_exporter.backends import simple
from gpu_exporter.backends.amd import backend as amd
from gpu_exporter.backends.simple import Simple
from gpu_exporter.config import Config
from gpu_exporter.model import SeriesKey
from tests.fakes.fake_amdsmi import AMDSMI_STATUS_FILE_ERROR, FakeAmdSmi, mi300x


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (Simple("power_draw", "get_power"), "get_power -> 'power_draw': no such catalog key"),
        (Simple("ecc_block_corrected", "get_ecc"), "0 label value(s) for the catalog's 1 (block)"),
        (Simple("power", "get_power", labels=("psu",)), "1 label value(s) for the catalog's 0 (none)"),
        (Simple("power", "get_power", divide=0), "divide not 0"),
        (Simple("power", "get_power", low=10, high=0), "low 10 is above high 0"),
    ],
)
def test_a_row_the_catalog_contradicts_is_refused_when_the_table_is_built(row: Simple, message: str) -> None:
    good = Simple("power_limit", "get_power_limit")
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simple.by_group(good, row)
    assert simple.by_group(good, Simple("temp_gpu", "get_temp")) == {
        "power": (good,),
        "temperature": (Simple("temp_gpu", "get_temp"),),
    }


def test_range_strictness_and_levels_decide_what_is_a_reading() -> None:
    rows = (
        Simple("utilization", "load", divide=1000, low=0, high=1000, strict=True),
        Simple("memory_utilization", "activity", field="umc", divide=100, low=0, high=100),
        Simple("pcie_link_generation", "pcie", field="speed", levels=((16000, 4.0), (32000, 5.0))),
        Simple("pcie_link_width", "pcie", field="width"),
    )
    answers = {"load": 1001, "activity": {"umc": 65535}, "pcie": {"speed": 16000.0, "width": 16}}
    values: dict[SeriesKey, float] = {}
    errors: Counter[str] = Counter()
    simple.read(rows, lambda row: answers[row.call], values, errors)
    # load out of range: strict, counted; activity out of range: a sentinel, quietly absent
    assert values == {("pcie_link_generation", ()): 4.0, ("pcie_link_width", ()): 16.0}
    assert errors == {"load": 1}
    answers = {"load": 5, "activity": {"umc": 41}, "pcie": {"speed": 8000, "width": "N/A"}}
    values.clear()
    simple.read(rows, lambda row: answers[row.call], values, errors)
    assert values == {("utilization", ()): 5 / 1000, ("memory_utilization", ()): 41 / 100}  # 8000: no such level
    assert errors == {"load": 1}


def opened(card: Any, config: Config | None = None) -> tuple[amd.AmdBackend, FakeAmdSmi]:
    fake = FakeAmdSmi([card])
    backend = amd.AmdBackend(config or Config(gpu_vendor="amd"), smi=fake)
    backend.open()
    return backend, fake


def test_rows_that_read_one_answer_make_one_call_per_cycle() -> None:
    backend, fake = opened(mi300x())
    backend.read()
    backend.read()
    assert fake.calls["amdsmi_get_pcie_info"] == 2  # four rows: width, generation, bandwidth, replays
    assert fake.calls["amdsmi_get_gpu_activity"] == 2  # three rows
    assert fake.calls["amdsmi_get_gpu_total_ecc_count"] == 2
    assert fake.calls["amdsmi_get_clock_info"] == 6  # one per clock domain (graphics, memory, soc)


def test_a_wrong_shaped_answer_leaves_its_values_out_counted_once_and_the_rest_is_read() -> None:
    card = mi300x()
    assert card.pcie is not None
    card.pcie["pcie_metric"] = "N/A"  # a record where the rows read fields of a nested record
    card.activity = "N/A"  # type: ignore[assignment]  # a string where a record belongs
    backend, _ = opened(card)
    [gpu] = backend.read()
    assert gpu.up
    for key in ("pcie_link_width", "pcie_link_generation", "pcie_bandwidth", "pcie_replay", "utilization"):
        assert (key, ()) not in gpu.values
    assert backend.errors == {"amdsmi_get_pcie_info": 1, "amdsmi_get_gpu_activity": 1}  # once per call
    assert gpu.values[("clock_graphics", ())] == 2100e6
    assert gpu.values[("ecc_block_corrected", ("umc",))] == 12


def test_a_failing_simple_call_is_counted_asked_again_and_the_rest_is_read() -> None:
    card = mi300x()
    card.fail["amdsmi_get_clock_info"] = AMDSMI_STATUS_FILE_ERROR  # transient, not "not supported"
    backend, fake = opened(card)
    for cycle in (1, 2):
        [gpu] = backend.read()
        assert gpu.up
        assert not any(key.startswith("clock_") and "seconds" not in key for key, _ in gpu.values)
        assert backend.errors["amdsmi_get_clock_info"] == 3 * cycle  # each domain counted, every cycle
        assert gpu.values[("power_limit", ())] == 750.0
    fake.cards[0].fail.clear()
    [gpu] = backend.read()
    assert gpu.values[("clock_max_soc", ())] == 1524e6
