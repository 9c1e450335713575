"""Whole pages for each vendor layout, compared as text with checked-in files and checked by promtool.

Set UPDATE_GOLDEN=1 to rewrite the expected pages after an intended change, then review the diff.
"""

from __future__ import annotations

import pytest

from gpu_exporter import catalog
from gpu_exporter.backends.amd import backend as amd
from gpu_exporter.backends.jetson import backend as jetson
from gpu_exporter.config import Config
from gpu_exporter.exposition import native_view, render
from gpu_exporter.model import Sample
from tests.fakes.fake_amdsmi import FakeAmdSmi, mi210, mi300x
from tests.support import check_golden, paths, promtool_check

FIXTURES = paths.FIXTURES
BOARDS = ("nano", "xavier", "xavier-jp4", "orin-jp5", "orin-jp6", "orin-jp7")


def jetson_page(board: str) -> str:
    root = FIXTURES / "jetson" / board
    backend = jetson.create(Config(path_sysfs=str(root / "sys"), path_procfs=str(root / "proc")))
    backend.open()
    return render(Sample(1, 1_700_000_000.0, tuple(backend.read())), native_view())


def amd_page() -> str:
    backend = amd.create(Config(), smi=FakeAmdSmi([mi300x(0), mi210(1)]))
    backend.open()
    return render(Sample(1, 1_700_000_000.0, tuple(backend.read())), native_view())


@pytest.mark.parametrize("board", BOARDS)
def test_jetson_page_matches_golden_and_passes_promtool(board):
    page = jetson_page(board)
    check_golden(f"jetson_{board}.prom", page)
    promtool_check(page)


def test_amd_page_matches_golden_and_passes_promtool():
    page = amd_page()
    check_golden("amd_mi300x_mi210.prom", page)
    promtool_check(page)


def families(page: str) -> set[str]:
    return {line.split()[2] for line in page.splitlines() if line.startswith("# TYPE ")}


def test_same_quantity_has_the_same_name_for_every_vendor():
    """Dashboards do not care about the vendor: the common quantities share catalog names."""
    jetson_families = set.intersection(*(families(jetson_page(b)) for b in BOARDS))
    amd_families = families(amd_page())
    common = {
        "gpu_up",
        "gpu_info",
        "gpu_utilization_ratio",
        "gpu_memory_total_bytes",
        "gpu_memory_used_bytes",
        "gpu_memory_free_bytes",
        "gpu_temperature_celsius",
        "gpu_clock_hertz",
        "gpu_clock_max_hertz",
    }
    assert common <= jetson_families
    assert common <= amd_families
    assert {
        "gpu_power_watts",
        "gpu_power_limit_watts",
        "gpu_energy_joules_total",
        "gpu_ecc_errors_total",
        "gpu_pcie_link_width",
        "gpu_processes",
    } <= amd_families
    # every family on any vendor's page is a catalog family
    known = {m.name for m in catalog.CATALOG} | {"gpu_up", "gpu_info"}
    assert jetson_families | amd_families <= known
