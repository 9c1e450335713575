"""What NVML answers for Jetson Thor's GPU: its utilization, the use of its video engines, its processes (JetPack 7).

Thor's GPU runs on the ``nvidia.ko`` stack, not nvgpu: sysfs has its clock (devfreq ``gpu-gpc-0``) but no
``load`` file, processes open ``/dev/nvidia*`` rather than the nvgpu device nodes, and there is neither
``NvMapMemUsed`` nor nvmap's per-process table. Its NVML answers the utilization and the compute and
graphics process lists with each process's memory, the use of its video engines (part of the GPU there,
unlike Orin's, which are engines of their own), and NOT_SUPPORTED for memory, clocks, power and
temperature, which the Jetson backend takes from sysfs. The GPU's memory in use is therefore the sum of
its processes' memory (unified memory: the total is the system's RAM).

The device is the one NVML names as a Jetson's integrated GPU (``nvidia/integrated.py``). Calls go
through a ``CallGuard``: a call the GPU does not support is not made again, failures are counted in the
backend's errors under the NVML function's name.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from gpu_exporter.backends._calls import CallGuard, Fault, Lost
from gpu_exporter.backends.base import BackendError
from gpu_exporter.backends.nvidia.devices import text
from gpu_exporter.backends.nvidia.integrated import is_integrated
from gpu_exporter.backends.nvidia.library import classify, import_pynvml, init_message
from gpu_exporter.model import ProcessUsage

__all__ = ["ThorNvml"]

log = logging.getLogger("gpu_exporter.backends.jetson")

_LISTS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses")
_CODECS = (
    ("encoder_utilization", "nvmlDeviceGetEncoderUtilization"),
    ("decoder_utilization", "nvmlDeviceGetDecoderUtilization"),
)


class ThorNvml:
    """The integrated GPU's handle in NVML, opened by the Jetson backend on Thor."""

    def __init__(self, errors: Counter[str], nvml: Any = None) -> None:
        self._nv: Any = nvml
        self._handle: Any = None
        self._guard = CallGuard(
            log, self._classify, "%s is not in this NVIDIA driver; its readings are skipped", missing_level=logging.INFO
        )
        self._guard.errors = errors  # counted with the backend's sysfs reads
        self._initialised = False
        self.info: dict[str, str] = {}
        self.name = ""

    def open(self) -> str:
        """Empty when the GPU's NVML device is ready, else why NVML cannot be used (for the backend's log line)."""
        try:
            if self._nv is None:
                self._nv = import_pynvml()
            nv = self._nv
            nv.nvmlInit()
            self._initialised = True
        except BackendError as exc:
            return str(exc)
        except Exception as exc:  # NVMLError, or a library that fails to load some other way
            return (
                init_message(self._nv, exc) if isinstance(exc, self._nv.NVMLError) else f"{type(exc).__name__}: {exc}"
            )
        try:
            for index in range(int(nv.nvmlDeviceGetCount())):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                name = text(nv.nvmlDeviceGetName(handle))
                if is_integrated(name):
                    self._handle, self.name = handle, name
                    break
            driver = text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as exc:
            self.close()
            return f"NVML cannot list devices: {exc}"
        if self._handle is None:
            self.close()
            return "NVML lists no integrated GPU"
        self.info = {"driver_version": driver}
        try:
            cuda = int(nv.nvmlSystemGetCudaDriverVersion())
            self.info["cuda_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except nv.NVMLError:
            pass
        return ""

    def close(self) -> None:
        self._handle = None
        if self._initialised:
            self._initialised = False
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass

    @property
    def ready(self) -> bool:
        return self._handle is not None

    def _classify(self, exc: Exception) -> Fault | None:
        return classify(self._nv, exc)

    def _call(self, name: str) -> Any:
        """``nvml.<name>(handle)``, or None when unavailable (a lost GPU is counted, not raised)."""
        if self._handle is None:
            return None
        try:
            return self._guard.call("0", name, getattr(self._nv, name, None), self._handle)
        except Lost:
            return None

    def utilization(self) -> float | None:
        """The GPU's utilization, 0-1, or None."""
        rates = self._call("nvmlDeviceGetUtilizationRates")
        gpu = getattr(rates, "gpu", None)
        return gpu / 100 if isinstance(gpu, int) and 0 <= gpu <= 100 else None

    def codecs(self) -> dict[str, float]:
        """The video encoder's and decoder's utilization, 0-1, by catalog key (those that answer)."""
        out = {}
        for key, name in _CODECS:
            answer = self._call(name)  # [percent, sampling period in µs]
            if answer is not None and isinstance(answer[0], int) and 0 <= answer[0] <= 100:
                out[key] = answer[0] / 100
        return out

    def processes(self) -> tuple[ProcessUsage, ...] | None:
        """The compute and graphics processes, once each (a process in both with its larger memory), or
        None when neither list answers."""
        memory: dict[int, int | None] = {}
        answered = False
        for name in _LISTS:
            found = self._call(name)
            if found is None:
                continue
            answered = True
            for process in found:
                pid, used = int(process.pid), process.usedGpuMemory
                known = [m for m in (memory.get(pid), used) if m is not None]
                memory[pid] = max(known) if known else None
        if not answered:
            return None
        return tuple(ProcessUsage(pid, None if used is None else float(used)) for pid, used in sorted(memory.items()))

    def unsupported(self) -> list[str]:
        """What this GPU's NVML does not answer, asked once: "utilization", "processes" (for the log line)."""
        missing = []
        if self.utilization() is None:
            missing.append("utilization")
        if self.processes() is None:
            missing.append("processes")
        return missing
