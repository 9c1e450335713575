"""AMD Instinct and Radeon GPUs through the ``amdsmi`` Python package (ROCm's ``libamd_smi.so``).

The package binds the C library when it is imported and raises ``KeyError`` (after printing two lines)
when ``libamd_smi.so`` is missing, so the import happens in ``open()``, with stdout captured, and that
failure becomes one ``BackendError`` line. The module is a constructor argument, so tests pass a fake.

What the library cannot tell comes back as ``"N/A"`` or a max-int sentinel, or raises
``AmdSmiLibraryException`` with ``AMDSMI_STATUS_NOT_SUPPORTED``: the value is then absent, never 0.
A call a device does not support is not asked again on that device; a function the installed package
lacks is logged once and not asked again at all.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.backends._calls import Backoff, CallGuard, Fault, Liveness, Lost
from gpu_exporter.backends.amd.violation import ViolationTime
from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.health import HealthTracker
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, SeriesKey

__all__ = ["AmdBackend", "create"]

log = logging.getLogger("gpu_exporter.backends.amd")  # the name its log lines have always had

# amdsmi_status_t codes from amdsmi.h (stable ABI values; the package does not re-export them)
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_YET_IMPLEMENTED = 3
STATUS_NO_PERM = 10
STATUS_INIT_ERROR = 18
STATUS_NOT_FOUND = 31
STATUS_NOT_INIT = 32
STATUS_DRIVER_NOT_LOADED = 34
STATUS_AMDGPU_RESTART_ERR = 54

_UNSUPPORTED = frozenset({STATUS_NOT_SUPPORTED, STATUS_NOT_YET_IMPLEMENTED})
# the device is gone (fell off the bus, driver unloaded or restarting): mark it down for this cycle
_LOST = frozenset({STATUS_NOT_FOUND, STATUS_DRIVER_NOT_LOADED, STATUS_AMDGPU_RESTART_ERR, STATUS_NOT_INIT})
# values the library passes through when a field is not populated
_SENTINELS = frozenset({0xFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF})

_MHZ = 1e6
_MIB = 1024 * 1024
# PCIe transfer rate in MT/s -> generation
_PCIE_GEN = {2500: 1, 5000: 2, 8000: 3, 16000: 4, 32000: 5, 64000: 6}
# AmdSmiGpuBlock names read for per-block ECC counts, and the label each gets
_ECC_BLOCKS = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")

_LIBRARY_NOT_FOUND = (
    "AMD SMI library not found (libamd_smi.so): install ROCm's amd-smi-lib on the host and, in a pod, mount "
    "the host's /opt/rocm read-only at /opt/rocm with ROCM_PATH=/opt/rocm, plus /dev/kfd and /dev/dri "
    "(deploy/components/amd does all three)"
)
_LIBRARY_TOO_OLD = (
    "AMD SMI library libamd_smi.so lacks a function the amdsmi package {version} binds: the package must "
    "match the host's ROCm version (build the image with --build-arg AMDSMI=amdsmi==<ROCm version>)"
)


@dataclass
class _Card:
    index: int
    handle: Any
    id: DeviceId
    info: dict[str, str] = field(default_factory=dict)
    live: Liveness = field(default_factory=Liveness)
    violations: ViolationTime = field(default_factory=ViolationTime)


def _import_amdsmi() -> Any:
    """Import the real package, turning its KeyError-on-missing-library into a BackendError."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            import amdsmi
    except ModuleNotFoundError:
        raise BackendError(
            "Python package amdsmi is not installed: pip install amdsmi (matching the ROCm version)"
        ) from None
    except (KeyError, OSError):
        log.debug("amdsmi import said: %s", captured.getvalue().strip())
        raise BackendError(_LIBRARY_NOT_FOUND) from None
    except AttributeError as exc:  # ctypes: a symbol the package binds at import is not in the library
        log.debug("amdsmi import: %s", exc)
        raise BackendError(_LIBRARY_TOO_OLD.format(version=_package_version())) from None
    return amdsmi


def _package_version() -> str:
    try:
        return importlib.metadata.version("amdsmi")
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def number(value: Any, sentinels: frozenset[int] = _SENTINELS) -> float | None:
    """A reading as a float, or None for "N/A", max-int sentinels and anything not a finite number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return None if value in sentinels else float(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return None


class AmdBackend:
    """Reads every AMD GPU that amdsmi lists."""

    name = "amd"

    def __init__(
        self,
        config: Config,
        smi: Any = None,
        *,
        retry_initial: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._smi = smi
        self._clock = clock
        self._calls = CallGuard(
            log,
            self._classify,
            "amdsmi has no %s (older package?): those values are not collected",
            describe=self._describe,
        )
        self.errors = self._calls.errors
        self._backoff = Backoff(log, retry_initial, clock)
        self._lock = threading.Lock()
        self._cards: list[_Card] = []
        self._initialised = False
        self._health = HealthTracker()

    # -- lifecycle -------------------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self._smi is None:
                self._smi = _import_amdsmi()
            smi = self._smi
            try:
                smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            except smi.AmdSmiLibraryException as exc:
                raise BackendError(self._init_reason(exc.get_error_code())) from None
            except smi.AmdSmiException as exc:
                raise BackendError(f"AMD SMI initialisation failed: {exc}") from None
            self._initialised = True
            try:
                handles = list(smi.amdsmi_get_processor_handles())
            except smi.AmdSmiException as exc:
                self._shutdown()
                raise BackendError(f"AMD SMI cannot list GPUs: {exc}") from None
            if not handles:
                self._shutdown()
                raise NoDevicesError("AMD SMI works but reports no GPU (is the amdgpu driver bound?)")
            self._cards = [_Card(i, h, DeviceId(str(i), "")) for i, h in enumerate(handles)]
            for card in self._cards:
                try:
                    self._attach(card)
                    card.live.up = True
                except Lost as exc:
                    self._backoff.lost(card, f"at start: {exc}")
            log.info("AMD SMI: %d GPU(s): %s", len(handles), ", ".join(c.info.get("name", "?") for c in self._cards))

    @staticmethod
    def _init_reason(code: int) -> str:
        if code == STATUS_DRIVER_NOT_LOADED:
            return "AMD SMI: the amdgpu kernel driver is not loaded (modprobe amdgpu)"
        if code == STATUS_NO_PERM:
            return (
                "AMD SMI: permission denied: run with access to /dev/kfd and /dev/dri "
                "(video, render groups; in a pod see deploy/components/amd)"
            )
        return f"AMD SMI initialisation failed with status {code}: check the amdgpu driver and ROCm install"

    def _shutdown(self) -> None:
        if self._initialised and self._smi is not None:
            try:
                self._smi.amdsmi_shut_down()
            except Exception as exc:  # shutting down must not fail the caller
                log.debug("amdsmi_shut_down failed: %s", exc)
        self._initialised = False

    def close(self) -> None:
        with self._lock:
            self._shutdown()

    def healthy(self) -> bool:
        return self._initialised and any(c.live.up for c in self._cards)

    # -- calls -----------------------------------------------------------------------------------

    def _call(self, index: int, call: str, *args: Any, label: str = "") -> Any:
        """Call ``amdsmi.<call>(handle, *args)``; None when unsupported or failed (counted). Raises Lost."""
        func = getattr(self._smi, call, None)
        return self._calls.call(index, call, func, self._cards[index].handle, *args, variant=label)

    def _classify(self, exc: Exception) -> Fault:
        if not isinstance(exc, self._smi.AmdSmiLibraryException):
            return Fault.ERROR  # one bad call never fails the cycle
        code = exc.get_error_code()
        return Fault.UNSUPPORTED if code in _UNSUPPORTED else Fault.LOST if code in _LOST else Fault.ERROR

    def _describe(self, exc: Exception) -> str:
        if isinstance(exc, self._smi.AmdSmiLibraryException):
            return f"status {exc.get_error_code()}"  # its str() spans lines
        return str(exc)

    def _attach(self, card: _Card) -> None:
        """Static identity, read at open and when a lost card comes back; raises Lost."""
        index = card.index
        uuid = self._call(index, "amdsmi_get_gpu_device_uuid")
        bdf = self._call(index, "amdsmi_get_gpu_device_bdf")
        asic = self._call(index, "amdsmi_get_gpu_asic_info") or {}
        driver = self._call(index, "amdsmi_get_gpu_driver_info") or {}
        vbios = self._call(index, "amdsmi_get_gpu_vbios_info") or {}
        fields = {
            "name": asic.get("market_name"),
            "serial": asic.get("asic_serial"),
            "pci_bus_id": bdf,
            "driver_version": driver.get("driver_version"),
            "vbios_version": vbios.get("version"),
        }
        info = {"vendor": "amd"}
        for key, value in fields.items():
            if isinstance(value, str) and value.strip() and value.strip() != "N/A":
                info[key] = value.strip()
        card.info = info
        uuid = uuid.strip() if isinstance(uuid, str) else ""
        card.id = DeviceId(str(index), uuid or f"amd-{info.get('pci_bus_id', index)}")

    # -- reading ---------------------------------------------------------------------------------

    def read(self) -> list[DeviceSample]:
        with self._lock:
            now = self._clock()
            out = []
            for card in self._cards:
                sample = self._backoff.poll(card, now, self._attach, self._read_card)
                out.append(sample if sample is not None else DeviceSample(card.id, False, info=dict(card.info)))
            return out

    def _read_card(self, card: _Card) -> DeviceSample:
        values: dict[SeriesKey, float] = {}
        self._read_values(card.index, values)
        processes = self._read_processes(card.index, values)
        if self._config.collector_enabled("health"):
            values.update(self._health.evaluate(card.index, values, self._clock()))
        return DeviceSample(card.id, True, values, dict(card.info), processes)

    def _read_values(self, index: int, values: dict[SeriesKey, float]) -> None:
        enabled = self._config.collector_enabled
        for group, reader in (
            ("utilization", self._utilization),
            ("memory", self._memory),
            ("temperature", self._temperature),
            ("power", self._power),
            ("clocks", self._clocks),
            ("fan", self._fan),
            ("pcie", self._pcie),
            ("ecc", self._ecc),
        ):
            if enabled(group):
                reader(index, _Values(values))

    def _utilization(self, index: int, v: _Values) -> None:
        activity = self._call(index, "amdsmi_get_gpu_activity") or {}
        v.ratio("utilization", activity.get("gfx_activity"))
        v.ratio("memory_utilization", activity.get("umc_activity"))
        v.ratio("multimedia_utilization", activity.get("mm_activity"))

    def _memory(self, index: int, v: _Values) -> None:
        vram = self._smi.AmdSmiMemoryType.VRAM
        total = self._call(index, "amdsmi_get_gpu_memory_total", vram)
        used = self._call(index, "amdsmi_get_gpu_memory_usage", vram)
        if total is None or used is None:  # older cards and packages: the MB-granular call
            usage = self._call(index, "amdsmi_get_gpu_vram_usage") or {}
            total = total if total is not None else _scaled(usage.get("vram_total"), _MIB)
            used = used if used is not None else _scaled(usage.get("vram_used"), _MIB)
        v.put("memory_total", total)
        v.put("memory_used", used)
        total, used = number(total), number(used)
        if total is not None and used is not None and used <= total:
            v.put("memory_free", total - used)

    def _temp(self, index: int, sensor: str) -> float | None:
        smi = self._smi
        member = getattr(smi.AmdSmiTemperatureType, sensor)
        current = smi.AmdSmiTemperatureMetric.CURRENT
        return number(self._call(index, "amdsmi_get_temp_metric", member, current, label=sensor.lower()))

    def _temperature(self, index: int, v: _Values) -> None:
        v.put("temp_gpu", self._temp(index, "EDGE"))
        v.put("temp_junction", self._temp(index, "HOTSPOT"))
        memory = self._temp(index, "VRAM")
        if memory is None:  # HBM parts report per stack: the hottest stack is what matters
            stacks = [t for t in (self._temp(index, f"HBM_{n}") for n in range(4)) if t is not None]
            memory = max(stacks) if stacks else None
        v.put("temp_memory", memory)

    def _power(self, index: int, v: _Values) -> None:
        power = self._call(index, "amdsmi_get_power_info") or {}
        watts = number(power.get("current_socket_power"))  # MI300-class: instantaneous
        if watts is None:
            watts = number(power.get("average_socket_power"))  # older: averaged by the firmware
        v.put("power", watts)
        cap = self._call(index, "amdsmi_get_power_cap_info") or {}
        v.put("power_limit", cap.get("power_cap"), 1e-6)  # µW
        energy = self._call(index, "amdsmi_get_energy_count") or {}
        accumulator = number(energy.get("energy_accumulator"), frozenset({0xFFFFFFFFFFFFFFFF}))
        resolution = number(energy.get("counter_resolution"))
        if accumulator is not None and resolution is not None and resolution > 0:
            v.put("energy", accumulator * resolution * 1e-6)  # µJ -> J

    def _clocks(self, index: int, v: _Values) -> None:
        clk = self._smi.AmdSmiClkType
        for domain, ctype in (("graphics", clk.GFX), ("memory", clk.MEM), ("soc", clk.SOC)):
            info = self._call(index, "amdsmi_get_clock_info", ctype, label=domain) or {}
            v.put(f"clock_{domain}", info.get("clk"), _MHZ)
            v.put(f"clock_max_{domain}", info.get("max_clk"), _MHZ)
        status = self._call(index, "amdsmi_get_violation_status")
        if status is not None:
            for reason, seconds in self._cards[index].violations.update(status, self._clock()).items():
                v.put(f"clock_event_seconds_{reason}", seconds)

    def _fan(self, index: int, v: _Values) -> None:
        speed = number(self._call(index, "amdsmi_get_gpu_fan_speed", 0))
        if speed is not None:
            top = number(self._call(index, "amdsmi_get_gpu_fan_speed_max", 0)) or 255.0
            if 0 <= speed <= top:
                v.put("fan_speed", speed / top)

    def _pcie(self, index: int, v: _Values) -> None:
        pcie = (self._call(index, "amdsmi_get_pcie_info") or {}).get("pcie_metric") or {}
        v.put("pcie_link_width", pcie.get("pcie_width"))
        rate = number(pcie.get("pcie_speed"))  # MT/s
        if rate is not None and int(rate) in _PCIE_GEN:
            v.put("pcie_link_generation", _PCIE_GEN[int(rate)])
        v.put("pcie_bandwidth", pcie.get("pcie_bandwidth"), 1e6 / 8)  # Mb/s -> bytes/s
        v.put("pcie_replay", pcie.get("pcie_replay_count"))

    def _ecc(self, index: int, v: _Values) -> None:
        ecc = self._call(index, "amdsmi_get_gpu_total_ecc_count") or {}
        v.put("ecc_corrected_volatile", ecc.get("correctable_count"))
        v.put("ecc_uncorrected_volatile", ecc.get("uncorrectable_count"))
        for block in _ECC_BLOCKS:
            member = getattr(self._smi.AmdSmiGpuBlock, block, None)
            if member is None:
                continue
            counts = self._call(index, "amdsmi_get_gpu_ecc_count", member, label=block) or {}
            label = (block.lower(),)
            v.put("ecc_block_corrected", counts.get("correctable_count"), labels=label)
            v.put("ecc_block_uncorrected", counts.get("uncorrectable_count"), labels=label)

    def _read_processes(self, index: int, values: dict[SeriesKey, float]) -> tuple[ProcessUsage, ...]:
        if not self._config.collector_enabled("processes"):
            return ()
        listed = self._call(index, "amdsmi_get_gpu_process_list")
        if listed is None:
            return ()
        processes = []
        for entry in listed:
            pid = entry.get("pid") if isinstance(entry, dict) else None
            if not isinstance(pid, int) or pid <= 0:
                self.errors["amdsmi_get_gpu_process_list"] += 1
                continue
            usage = entry.get("memory_usage")
            vram = number(usage.get("vram_mem")) if isinstance(usage, dict) else None
            processes.append(ProcessUsage(pid=pid, memory_bytes=vram))
        values[("processes", ())] = float(len(processes))
        known = [p.memory_bytes for p in processes if p.memory_bytes is not None]
        if known or not processes:
            values[("processes_memory", ())] = float(sum(known))
        return tuple(processes)


class _Values:
    """Puts readings into a sample's values, leaving out what is not a number."""

    __slots__ = ("values",)

    def __init__(self, values: dict[SeriesKey, float]) -> None:
        self.values = values

    def put(self, key: str, value: Any, scale: float = 1.0, labels: tuple[str, ...] = ()) -> None:
        v = number(value)
        if v is not None:
            self.values[(key, labels)] = v * scale

    def ratio(self, key: str, percent: Any) -> None:
        v = number(percent)
        if v is not None and 0 <= v <= 100:  # activity above 100 % is a sentinel, not a reading
            self.values[(key, ())] = v / 100


def _scaled(value: Any, scale: float) -> float | None:
    v = number(value)
    return None if v is None else v * scale


def create(config: Config, smi: Any = None) -> AmdBackend:
    return AmdBackend(config, smi)
