"""The README's metric table is generated from the catalog and must match it; the docs' log examples
are lines the agent prints."""

from __future__ import annotations

import re
from pathlib import Path

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


_LEVELS = ("debug", "info", "warn", "error")
_LOGFMT = re.compile(
    r"^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(?P<level>\w+) caller=(?P<file>[\w/]+\.py):\d+ "
    r'msg=(?P<msg>"(?:[^"\\]|\\.)*"|[^ ="\\]+)(?: [\w.]+=(?:"(?:[^"\\]|\\.)*"|[^ ="\\]+))*$'
)


def _doc_files() -> list[Path]:
    return [README, *sorted((paths.ROOT / "docs").glob("**/*.md"))]


def test_log_examples_in_the_docs_are_lines_the_agent_prints() -> None:
    """A log line in a code block reads as gpu_exporter/logs.py writes it (logfmt: ts, level, caller, msg),
    from a source file that exists; not the ``WARNING logger: message`` of Python's default format."""
    examples = 0
    for doc in _doc_files():
        in_code = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            where = f"{doc.relative_to(paths.ROOT)}:{number}"
            if not in_code:
                continue
            assert not re.match(r"^(DEBUG|INFO|WARNING|ERROR) gpu_exporter", line), f"{where}: not logfmt: {line}"
            if not line.startswith("ts="):
                continue
            examples += 1
            found = _LOGFMT.match(line)
            assert found, f"{where}: not a line logs.py writes: {line}"
            assert found["level"] in _LEVELS, where
            assert (paths.SRC / "gpu_exporter" / found["file"]).is_file(), f"{where}: no such source {found['file']}"
    assert examples >= 5
