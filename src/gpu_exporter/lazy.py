"""Names a package exports but imports on first use (PEP 562), for packages that every command imports
early and whose names would otherwise drag in heavy modules, or modules that import the package back."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["exports"]


def exports(namespace: dict[str, Any], homes: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` for ``namespace`` (the package's ``globals()``): each name in ``homes``
    is read from the module named there on first use, then kept in ``namespace``."""

    def getattr_(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # once: later lookups find it in the module
        return value

    return getattr_
