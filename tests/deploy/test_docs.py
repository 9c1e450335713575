"""The README's metric table is generated from the catalog and must match it."""

from __future__ import annotations

from gpu_exporter import catalog
from tests.support import paths

README = paths.ROOT / "README.md"


def test_readme_metric_table_matches_catalog() -> None:
    text = README.read_text()
    assert catalog.markdown_table() in text, "README metric table is stale: run python tools/gen_readme.py"


def test_catalog_families_are_consistent() -> None:
    for fam in catalog.families():
        assert len({m.type for m in fam.metrics}) == 1, fam.name
        assert len({m.help for m in fam.metrics}) == 1, fam.name
        assert (fam.type == "counter") == fam.name.endswith("_total"), fam.name
        label_sets = {tuple(k for k, _ in m.const_labels) + m.labels for m in fam.metrics}
        assert len(label_sets) == 1, f"{fam.name} mixes label names: {label_sets}"
        consts = [m.const_labels for m in fam.metrics]
        assert len(consts) == len(set(consts)) or any(m.labels for m in fam.metrics), fam.name
    assert len({m.dcgm for m in catalog.CATALOG if m.dcgm}) == len([m for m in catalog.CATALOG if m.dcgm])
