"""Golden pages: a whole page compared as text with a file in tests/golden/.

``UPDATE_GOLDEN=1`` rewrites the files instead of comparing; review the diff before committing it."""

from __future__ import annotations

import os
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
