"""How the benches print a figure over several runs: the median, and the range when there is more than
one value (imported by the bench scripts, which run with bench/ on their path; no side effects)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["figure"]


def figure(values: Sequence[float], digits: int = 1) -> str:
    """``12.3 (11.9-13.0)``: the median and the range of ``values`` to ``digits`` decimals."""
    median = f"{statistics.median(values):.{digits}f}"
    return median if len(values) == 1 else f"{median} ({min(values):.{digits}f}-{max(values):.{digits}f})"
