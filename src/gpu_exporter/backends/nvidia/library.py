"""Loading nvidia-ml-py, and the one-line reasons why NVML cannot start."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from gpu_exporter.backends._calls import Fault
from gpu_exporter.backends.base import BackendError

__all__ = ["classify", "import_pynvml", "init_message"]


def import_pynvml() -> ModuleType:
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        raise BackendError("the nvidia-ml-py package is not installed (pip install nvidia-ml-py)") from None
    return module


def init_message(nv: Any, exc: Exception) -> str:
    if isinstance(exc, nv.NVMLError_LibraryNotFound):
        return (
            "NVIDIA library libnvidia-ml.so.1 not found: check that the NVIDIA driver is installed and, "
            "in a container, that it runs with the NVIDIA runtime (runtimeClassName: nvidia, "
            "NVIDIA_VISIBLE_DEVICES=all)"
        )
    if isinstance(exc, nv.NVMLError_DriverNotLoaded):
        return "NVIDIA driver is not loaded: check `lsmod | grep nvidia` and the driver installation"
    if isinstance(exc, nv.NVMLError_LibRmVersionMismatch):
        return (
            "NVIDIA driver/library version mismatch: the kernel module and libnvidia-ml.so differ "
            "(usually after a driver upgrade without reboot); reload the driver or reboot"
        )
    if isinstance(exc, nv.NVMLError_NoPermission):
        return "no permission to open the NVIDIA devices: check access to /dev/nvidia*"
    return f"NVML initialisation failed: {exc}"


def classify(nv: Any, exc: Exception) -> Fault | None:
    """What an NVML error means for the call that raised it (``_calls.CallGuard``); None: not NVML's."""
    if isinstance(exc, nv.NVMLLibraryMismatchError):
        return Fault.MISSING  # pynvml's unversioned wrapper when the driver lacks the newest variant
    if not isinstance(exc, nv.NVMLError):
        return None
    if isinstance(exc, (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument)):
        return Fault.UNSUPPORTED
    if isinstance(exc, nv.NVMLError_FunctionNotFound):
        return Fault.MISSING
    if isinstance(exc, (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired)):
        return Fault.LOST
    if isinstance(exc, (nv.NVMLError_NotFound, nv.NVMLError_NoData)):
        return Fault.EMPTY  # nothing to report right now (no process samples yet)
    return Fault.ERROR
