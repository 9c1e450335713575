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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_exporter.backends import simple
from gpu_exporter.backends._calls import Backoff, CallGuard, Fault, Liveness, Lost
from gpu_exporter.backends.amd.violation import ViolationTime
from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.health import HealthTracker
from gpu_exporter.backends.simple import Simple
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, SeriesKey

__all__ = ["AmdBackend", "create"]

log = logging.getLogger("gpu_exporter.backends.amd")  # the name its log lines have always had

# amdsmi_status_t codes from amdsmi.h (stable ABI values; the package does not re-export them)
CLOSE_WAIT = 2.0  # seconds close() waits for a read in flight
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
_PCIE_GEN = ((2500, 1.0), (5000, 2.0), (8000, 3.0), (16000, 4.0), (32000, 5.0), (64000, 6.0))
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
    return simple.number(value, sentinels)


def _member(smi: Any, name: str) -> Any:
    """``smi.<Enum>.<MEMBER>`` named ``"Enum.MEMBER"`` in a row's arguments; None when the package lacks it."""
    enum_name, _, member = name.partition(".")
    return getattr(getattr(smi, enum_name, None), member, None)


# One-call readings (backends/simple.py), by catalog group: the catalog key, the amdsmi function, its
# arguments after the handle (enum members by name), the field of the record it answers, the scale to
# the catalog's base unit and the raw values that are readings. Reads that take more are methods below.
SIMPLE_CALLS = simple.by_group(
    # activity above 100 % is a sentinel, not a reading
    *(
        Simple(key, "amdsmi_get_gpu_activity", field=name, divide=100, low=0, high=100)
        for key, name in (
            ("utilization", "gfx_activity"),
            ("memory_utilization", "umc_activity"),
            ("multimedia_utilization", "mm_activity"),
        )
    ),
    *(
        Simple(
            key,
            "amdsmi_get_temp_metric",
            (f"AmdSmiTemperatureType.{sensor}", "AmdSmiTemperatureMetric.CURRENT"),
            variant=sensor.lower(),
        )
        for key, sensor in (("temp_gpu", "EDGE"), ("temp_junction", "HOTSPOT"))
    ),
    Simple("power_limit", "amdsmi_get_power_cap_info", field="power_cap", scale=1e-6),  # µW
    *(
        Simple(key, "amdsmi_get_clock_info", (f"AmdSmiClkType.{ctype}",), field=name, scale=_MHZ, variant=domain)
        for domain, ctype in (("graphics", "GFX"), ("memory", "MEM"), ("soc", "SOC"))
        for key, name in ((f"clock_{domain}", "clk"), (f"clock_max_{domain}", "max_clk"))
    ),
    Simple("pcie_link_width", "amdsmi_get_pcie_info", field="pcie_metric.pcie_width"),
    Simple("pcie_link_generation", "amdsmi_get_pcie_info", field="pcie_metric.pcie_speed", levels=_PCIE_GEN),  # MT/s
    Simple("pcie_bandwidth", "amdsmi_get_pcie_info", field="pcie_metric.pcie_bandwidth", scale=1e6 / 8),  # Mb/s
    Simple("pcie_replay", "amdsmi_get_pcie_info", field="pcie_metric.pcie_replay_count"),
    Simple("ecc_corrected_volatile", "amdsmi_get_gpu_total_ecc_count", field="correctable_count"),
    Simple("ecc_uncorrected_volatile", "amdsmi_get_gpu_total_ecc_count", field="uncorrectable_count"),
    *(
        Simple(
            key,
            "amdsmi_get_gpu_ecc_count",
            (f"AmdSmiGpuBlock.{block}",),
            field=name,
            labels=(block.lower(),),
            variant=block,
        )
        for block in _ECC_BLOCKS
        for key, name in (
            ("ecc_block_corrected", "correctable_count"),
            ("ecc_block_uncorrected", "uncorrectable_count"),
        )
    ),
)


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
        # A read in flight holds the lock; a stop waits for it a moment, never for a call that hangs in
        # the driver (the process ends anyway, and shutting the library down under that call is unsafe).
        if not self._lock.acquire(timeout=CLOSE_WAIT):
            log.warning("a read of AMD SMI is still running after %gs: stopping without shutting it down", CLOSE_WAIT)
            return
        try:
            self._shutdown()
        finally:
            self._lock.release()

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
            ("utilization", None),
            ("memory", self._memory),
            ("temperature", self._temperature),
            ("power", self._power),
            ("clocks", self._clocks),
            ("fan", self._fan),
            ("pcie", None),
            ("ecc", None),
        ):
            if enabled(group):
                self._simple(index, values, group)
                if reader is not None:
                    reader(index, _Values(values))

    def _simple(self, index: int, values: dict[SeriesKey, float], group: str) -> None:
        """The one-call readings of ``group`` (SIMPLE_CALLS), each distinct call made once."""

        def fetch(row: Simple) -> Any:
            args = [_member(self._smi, a) if isinstance(a, str) else a for a in row.args]
            if any(a is None for a in args):
                return None  # an older package without that sensor, clock or block
            return self._call(index, row.call, *args, label=row.variant)

        simple.read(SIMPLE_CALLS.get(group, ()), fetch, values, self.errors, number)

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
        """The memory's temperature (after temp_gpu and temp_junction, SIMPLE_CALLS)."""
        memory = self._temp(index, "VRAM")
        if memory is None:  # HBM parts report per stack: the hottest stack is what matters
            stacks = [t for t in (self._temp(index, f"HBM_{n}") for n in range(4)) if t is not None]
            memory = max(stacks) if stacks else None
        v.put("temp_memory", memory)

    def _power(self, index: int, v: _Values) -> None:
        """Power and energy (after power_limit, SIMPLE_CALLS)."""
        power = self._call(index, "amdsmi_get_power_info") or {}
        watts = number(power.get("current_socket_power"))  # MI300-class: instantaneous
        if watts is None:
            watts = number(power.get("average_socket_power"))  # older: averaged by the firmware
        v.put("power", watts)
        energy = self._call(index, "amdsmi_get_energy_count") or {}
        accumulator = number(energy.get("energy_accumulator"), frozenset({0xFFFFFFFFFFFFFFFF}))
        resolution = number(energy.get("counter_resolution"))
        if accumulator is not None and resolution is not None and resolution > 0:
            v.put("energy", accumulator * resolution * 1e-6)  # µJ -> J

    def _clocks(self, index: int, v: _Values) -> None:
        """Throttle time by cause (after the clocks, SIMPLE_CALLS)."""
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


def _scaled(value: Any, scale: float) -> float | None:
    v = number(value)
    return None if v is None else v * scale


def create(config: Config, smi: Any = None) -> AmdBackend:
    return AmdBackend(config, smi)
