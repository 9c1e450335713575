"""Prometheus text for the per-pod series, rendered once per sample on the attribution thread."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpu_exporter import catalog
from gpu_exporter.catalog.metric import POD_LABELS, PROCESS_LABELS

__all__ = ["FAMILIES", "KEYS", "NAMES", "PodSeries", "render"]

# family name -> catalog key of the per-pod series (the entries labelled by pod), and -> (type, help):
# from the catalog, so that /metrics and the forwarded series agree
KEYS: dict[str, str] = {m.name: m.key for m in catalog.CATALOG if m.labels == POD_LABELS}
NAMES: dict[str, str] = {key: name for name, key in KEYS.items()}  # catalog key -> family name
# the per-pod families, then the per-process ones (opt-in)
FAMILIES: dict[str, tuple[str, str]] = {
    m.name: (m.type, m.help) for m in catalog.CATALOG if m.labels in (POD_LABELS, PROCESS_LABELS)
}

# (family name, label pairs, value)
PodSeries = tuple[str, tuple[tuple[str, str], ...], float]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def render(series: Iterable[PodSeries], families: Sequence[str] = tuple(FAMILIES)) -> str:
    """Text exposition of ``series``, grouped by family in FAMILIES order; empty families are left out."""
    grouped: dict[str, list[str]] = {name: [] for name in families}
    for name, labels, value in series:
        if name not in grouped:
            continue
        text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        grouped[name].append(f"{name}{{{text}}} {_value(value)}\n")
    out: list[str] = []
    for name, lines in grouped.items():
        if lines:
            kind, help_text = FAMILIES[name]
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
            out.extend(lines)
    return "".join(out)
