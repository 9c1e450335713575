"""Which vendors exist: each vendor package (``backends/<vendor>/``) registers itself on import.

A vendor package's ``__init__`` calls ``register`` and imports nothing else, so that listing the
vendors (for ``--gpu-vendor``'s choices) never loads a vendor library. The backend module named by
``factory`` is imported only when that vendor is asked for (``base.create``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass

__all__ = ["Vendor", "auto_order", "register", "vendor", "vendors"]


@dataclass(frozen=True, slots=True)
class Vendor:
    name: str  # the value of --gpu-vendor
    factory: str  # "module:function" building the backend from a Config
    rank: int  # position in --gpu-vendor's choices and in auto-detection
    auto: bool = True  # tried by --gpu-vendor=auto


_VENDORS: dict[str, Vendor] = {}


def register(entry: Vendor) -> None:
    """Called once by each vendor package's ``__init__``."""
    if entry.name in _VENDORS and _VENDORS[entry.name] != entry:
        raise ValueError(f"vendor {entry.name!r} registered twice")
    _VENDORS[entry.name] = entry


def _load() -> list[Vendor]:
    package = importlib.import_module(__package__ or "gpu_exporter.backends")
    for module in pkgutil.iter_modules(package.__path__):
        if module.ispkg:
            importlib.import_module(f"{package.__name__}.{module.name}")
    return sorted(_VENDORS.values(), key=lambda v: (v.rank, v.name))


def vendors() -> tuple[str, ...]:
    """Every registered vendor name, in rank order."""
    return tuple(v.name for v in _load())


def auto_order() -> tuple[str, ...]:
    """The vendors --gpu-vendor=auto tries, in order; a node with several vendors runs them all."""
    return tuple(v.name for v in _load() if v.auto)


def vendor(name: str) -> Vendor:
    """The registered vendor called ``name`` (KeyError when there is none)."""
    _load()
    return _VENDORS[name]
