"""Golden pages: a whole page compared as text with a file in tests/golden/ (in process, or scraped from
the CLI with what varies between runs masked: ``normalise_page``).

``UPDATE_GOLDEN=1`` rewrites the files instead of comparing; review the diff before committing it."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .paths import GOLDEN


def check_golden(name: str | Path, text: str) -> None:
    """Compare ``text`` with ``tests/golden/<name>`` (or rewrite it under UPDATE_GOLDEN=1)."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden page {path}; run with UPDATE_GOLDEN=1 to write it, then review it"
    assert text == path.read_text(), f"page differs from {path}; rerun with UPDATE_GOLDEN=1 if intended"


# The agent's own series whose values are the run's, not the page's: how long collecting took, how often it
# ran by the scrape, when, the process's resources, the connections (readiness polls, the scrape itself).
# Their names, labels and value format stay checked: each number becomes N ("6.0" -> "N.N", "3.1e+07" ->
# "N.Ne+N").
RUN_VALUES = re.compile(
    r"^(gpu_exporter_collect_duration_seconds|gpu_exporter_collect_seconds_total|gpu_exporter_collects_total"
    r"|gpu_exporter_collect_overruns_total|gpu_exporter_last_collect_success_timestamp_seconds"
    r"|gpu_exporter_ring_samples|gpu_exporter_http_connections|gpu_exporter_http_connections_accepted_total|process_[a-z_]+)(\{[^}]*\})? "
)
# build_info's labels that name the build: the checkout's revision, the interpreter, the release
BUILD_LABELS = re.compile(r'\b(build_date|python_version|revision|version)="[^"]*"')


def normalise_page(text: str) -> str:
    """A scraped page with what varies between runs of the same build on the same fixtures masked."""
    lines = []
    for line in text.splitlines():
        if line.startswith("gpu_exporter_build_info{"):
            line = BUILD_LABELS.sub(lambda m: f'{m.group(1)}="<{m.group(1)}>"', line)
        match = RUN_VALUES.match(line)
        if match:
            line = line[: match.end()] + re.sub(r"\d+", "N", line[match.end() :])
        lines.append(line)
    return "\n".join(lines) + "\n"
