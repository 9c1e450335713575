"""The catalog entry is the one home of a metric's DCGM mapping: field, scale, type, unit and help. The
catalog refuses, when it loads, an entry whose DCGM data is incomplete or stray, so that a new entry
cannot put a field on the DCGM page without a unit or a help text."""

from __future__ import annotations

import dataclasses

import pytest

from gpu_exporter import catalog
from gpu_exporter.catalog.metric import Variant, entry, family
from gpu_exporter.naming import dcgm_fields

GOOD = entry("x", "gpu_x_ratio", "gauge", "X (0-1).", "x", dcgm="DCGM_FI_X", scale=100, dcgm_unit="%", dcgm_help="X")


def test_the_catalog_as_shipped_passes_its_checks() -> None:
    catalog.check(catalog.CATALOG)
    catalog.check([GOOD])


@pytest.mark.parametrize(
    "change",
    [{"dcgm_unit": ""}, {"dcgm_help": ""}],
    ids=["no unit", "no help"],
)
def test_a_dcgm_field_without_its_unit_or_help_is_refused(change: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="DCGM_FI_X needs dcgm_unit and dcgm_help"):
        catalog.check([dataclasses.replace(GOOD, **change)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [{"dcgm_unit": "%"}, {"dcgm_help": "X"}, {"dcgm_type": "counter"}, {"dcgm_scale": 100.0}],
    ids=["unit", "help", "type", "scale"],
)
def test_dcgm_data_without_a_dcgm_field_is_refused(change: dict[str, object]) -> None:
    bare = entry("y", "gpu_y", "gauge", "Y.", "x")
    with pytest.raises(ValueError, match="without a DCGM field"):
        catalog.check([dataclasses.replace(bare, **change)])  # type: ignore[arg-type]


def test_a_duplicate_key_is_refused() -> None:
    with pytest.raises(ValueError, match="duplicate catalog key x"):
        catalog.check([GOOD, GOOD])


def test_a_family_gives_its_unit_to_the_variants_with_a_dcgm_field_only() -> None:
    temp = family(
        "gpu_t_celsius",
        "gauge",
        "T.",
        "t",
        Variant("t_gpu", {"sensor": "gpu"}, "DCGM_FI_T", "GPU T"),
        Variant("t_other", {"sensor": "other"}),
        dcgm_unit="C",
    )
    catalog.check(temp)
    assert [(m.dcgm_unit, m.dcgm_help) for m in temp] == [("C", "GPU T"), ("", "")]


def test_the_page_help_is_built_from_the_entry() -> None:
    """The help line of a DCGM family is the entry's help text and unit, so changing them in the catalog
    changes the page: nothing else holds them."""
    util = catalog.by_key("utilization")
    changed = dataclasses.replace(util, dcgm_unit="pct", dcgm_help="Busy")
    (field,) = dcgm_fields([changed])
    assert (field.name, field.unit, field.help) == ("DCGM_FI_DEV_GPU_UTIL", "pct", "Busy (in pct).")
    (shipped,) = dcgm_fields([util])
    assert shipped.help == "GPU utilization (in %)."
