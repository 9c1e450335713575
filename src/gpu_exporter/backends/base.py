"""The backend protocol, the errors a backend may raise, and opening the vendors asked for.

A backend is the only code that calls a vendor library. ``read()`` never raises for a problem with one
value or one device: it reports what it could read, marks lost devices ``up=False`` and counts failed
calls in ``errors``. ``open()`` raises ``BackendError`` with one line a user can act on.
"""

from __future__ import annotations

import importlib
import logging
from collections import Counter
from collections.abc import Callable
from typing import Protocol

from gpu_exporter.backends import registry
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceSample

__all__ = ["Backend", "BackendError", "NoDevicesError", "create", "detect"]

log = logging.getLogger(__name__)


class BackendError(Exception):
    """The vendor library cannot be used; the message says what to check."""


class NoDevicesError(BackendError):
    """The library works but reports no device."""


class Backend(Protocol):
    name: str
    errors: Counter[str]  # failed calls since start, by call name

    def open(self) -> None: ...

    def read(self) -> list[DeviceSample]: ...

    def healthy(self) -> bool: ...

    def close(self) -> None: ...


Factory = Callable[[Config], Backend]

_NOT_YET: dict[str, str] = {}  # vendor -> library, for a vendor whose backend is not written yet


def _factory(vendor: str) -> Factory:
    if vendor in _NOT_YET:
        raise BackendError(f"--gpu-vendor={vendor}: the {_NOT_YET[vendor]} backend is not available yet")
    module_name, _, attr = registry.vendor(vendor).factory.partition(":")
    factory: Factory = getattr(importlib.import_module(module_name), attr)
    return factory


def create(config: Config) -> list[Backend]:
    """Open the backend(s) the config asks for. Raises BackendError with a one-line reason."""
    if config.gpu_vendor == "auto":
        return detect(config)
    backend = _factory(config.gpu_vendor)(config)
    backend.open()
    return [backend]


def detect(config: Config) -> list[Backend]:
    """Every vendor whose library loads and reports at least one device, all opened.

    A mixed node (a Jetson with an NVIDIA card in its PCIe slot, a server with AMD and NVIDIA cards)
    gets one backend per vendor. One INFO line says what was found and why the others were not.
    """
    found: list[Backend] = []
    reasons: list[str] = []
    for vendor in registry.auto_order():
        try:
            backend = _factory(vendor)(config)
            backend.open()
        except BackendError as exc:
            reasons.append(f"{vendor}: {exc}")
            log.debug("auto-detect: %s not usable: %s", vendor, exc)
            continue
        except Exception as exc:  # a vendor library that breaks in an unforeseen way must not stop the others
            reasons.append(f"{vendor}: {type(exc).__name__}: {exc}")
            log.warning("auto-detect: %s failed unexpectedly: %s: %s", vendor, type(exc).__name__, exc)
            continue
        found.append(backend)
    if not found:
        raise BackendError(
            "no GPU found (" + "; ".join(reasons) + "); to try the exporter without one, run it with --gpu-vendor=fake"
        )
    log.info(
        "auto-detect: using %s%s",
        ", ".join(b.name for b in found),
        f" (not found: {'; '.join(reasons)})" if reasons else "",
    )
    return found
