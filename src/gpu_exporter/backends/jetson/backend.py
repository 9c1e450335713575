"""NVIDIA Jetson (Nano, TX2, Xavier, Orin, Thor) through sysfs and procfs, and on Thor NVML: no tegrastats.

The integrated GPU is found by its devfreq node (``class/devfreq/*`` whose ``device/of_node/name`` is a
known GPU, or whose name ends in ``.gpu``; on Thor ``gpu-gpc-0``), which also gives the clock and
governor. Container runtimes mask ``/sys/firmware``, so the device tree (``of_node``) may be unreadable:
then the SoC's own sysfs entry (``devices/soc0/family`` is ``Tegra``) vouches for a node called ``*.gpu``.
The load (0-1000) sits in the GPU device's folder. Temperatures come from the thermal zone whose type
starts with ``GPU``, power from the INA3221 rail monitors (hwmon on JetPack 5+, IIO on JetPack 4) and
Thor's INA238. The GPU shares system RAM: its memory is what the GPU driver has mapped (``jetson_procs``),
next to the shared RAM in use from ``/proc/meminfo``; its processes are those that hold the GPU's device
nodes open. Every path is under ``--path.sysfs`` and ``--path.procfs``, so the same code reads a fixture
tree in tests.

A file that is missing, unreadable or holds garbage makes that one value absent and counts an error
under the name of what was read (``load``, ``rail``...): a broken tree never fails the cycle.

Jetson Thor (JetPack 7) runs its GPU on the ``nvidia.ko`` stack: no ``load`` file, no nvgpu device nodes,
no nvmap accounting. There the utilization, the processes and the GPU's memory in use (their sum) come from
NVML (``jetson/nvml.py``), and everything else from sysfs as on the other boards. What the backend cannot
read on a board (no load, no GPU thermal zone, no rail, NVML absent) is named in its one start-up line.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from gpu_exporter import hostread
from gpu_exporter.backends import simple
from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.jetson import procs as jetson_procs
from gpu_exporter.backends.jetson.board import (
    GPU_RAILS,
    INPUT_RAILS,
    GpuNode,
    Rail,
    _read,
    _safe_read,
    find_gpu,
    find_gpu_thermal_zone,
    find_rails,
)
from gpu_exporter.backends.jetson.nvml import ThorNvml
from gpu_exporter.backends.simple import Simple
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, SeriesKey

__all__ = ["JetsonBackend", "create", "find_gpu"]

log = logging.getLogger("gpu_exporter.backends.jetson")  # the name its log lines have always had

CLOSE_WAIT = 2.0  # seconds close() waits for a read in flight before leaving Thor's NVML as it is
_MEMINFO_KEYS = frozenset({"MemTotal", "MemAvailable", "NvMapMemUsed"})
# Tegra thermal zones read -256 °C when the sensor is powered off
_NO_READING_MILLI_C = -100_000

# One-file readings (backends/simple.py), by catalog group: the catalog key, the name errors are counted
# under, the file as (folder, attribute) with the folders of ``_folders``, the conversion to the
# catalog's base unit and the raw values that are readings. Rails, memory and the governor take more.
SIMPLE_READS = simple.by_group(
    # load is 0-1000; anything else is a garbled file, counted
    Simple("utilization", "load", ("gpu", "load"), divide=1000, low=0, high=1000, strict=True),
    *(
        Simple(key, attr, ("devfreq", attr), low=0)  # Hz
        for key, attr in (
            ("clock_graphics", "cur_freq"),
            ("clock_min_graphics", "min_freq"),
            ("clock_max_graphics", "max_freq"),
        )
    ),
    # readings are whole m°C: above _NO_READING_MILLI_C
    Simple("temp_gpu", "temperature", ("thermal", "temp"), divide=1000, low=_NO_READING_MILLI_C + 1),
)


class JetsonBackend:
    """The one integrated GPU of a Jetson module."""

    name = "jetson"

    def __init__(self, config: Config, nvml: Any = None) -> None:
        self._nvml = nvml  # the NVML module for Thor (None: nvidia-ml-py's pynvml, imported when needed)
        self._thor: ThorNvml | None = None
        self._sysfs = Path(config.path_sysfs)
        self._procfs = Path(config.path_procfs)
        self._enabled = config.collector_enabled
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._gpu: GpuNode | None = None
        self._rails: list[Rail] = []
        self._thermal: Path | None = None
        self._device = DeviceId(gpu="0", uuid="")
        self._info: dict[str, str] = {}
        self._last_up = False
        self._warned_unreadable = False
        self._scanner = jetson_procs.ProcessScanner(self._procfs)

    def open(self) -> None:
        if not (self._sysfs / "class").is_dir():
            raise BackendError(f"--path.sysfs={self._sysfs} does not look like sysfs (no class/ folder)")
        gpu = find_gpu(self._sysfs)
        if gpu is None:
            raise NoDevicesError(
                f"no Jetson GPU under {self._sysfs}/class/devfreq (looked for gv11b, ga10b, gp10b, and *.gpu on an NVIDIA or Tegra board)"
            )
        base = self._sysfs / "firmware" / "devicetree" / "base"
        # the device tree's model, or where a container masks /sys/firmware, the SoC's copy of it
        model = _safe_read(base / "model") or _safe_read(self._sysfs / "devices" / "soc0" / "machine")
        serial = _safe_read(base / "serial-number")
        thor = ThorNvml(self.errors, self._nvml) if gpu.stack == "nvidia" else None
        why_not = thor.open() if thor is not None else ""
        with self._lock:
            self._gpu = gpu
            self._rails = find_rails(self._sysfs)
            self._thermal = find_gpu_thermal_zone(self._sysfs)
            self._device = DeviceId(gpu="0", uuid=f"jetson-{serial or gpu.devfreq.name}")
            self._info = {
                "name": f"{model or 'NVIDIA Jetson'} ({gpu.chip})",
                "vendor": "nvidia",
                "memory": "shared",
            }
            if serial:
                self._info["serial"] = serial
            self._thor = thor if thor is not None and thor.ready else None
            if self._thor is not None:
                self._info.update(self._thor.info)
            self._last_up = True
        missing = self._thor.unsupported() if self._thor is not None else ["utilization", "processes"]
        unread = self._unread(gpu, missing, why_not)
        nvml_load = gpu.stack == "nvidia" and "utilization" not in missing
        log.log(
            logging.WARNING if unread else logging.INFO,
            "Jetson GPU %s at %s: load %s, thermal zone %s, rails %s%s",
            gpu.chip,
            gpu.devfreq,
            "yes" if gpu.load else f"from NVML ({self._thor.name})" if self._thor and nvml_load else "not found",
            self._thermal.name if self._thermal else "not found",
            ", ".join(r.name for r in self._rails) or "not found",
            f"; could not read: {'; '.join(unread)}" if unread else "",
        )

    def _unread(self, gpu: GpuNode, missing: list[str], why_not: str) -> list[str]:
        """What this board does not give, each with why, for the one start-up line (``missing``: what
        Thor's NVML does not answer, or all of it when NVML is not there)."""
        unread = []
        if gpu.stack == "nvidia":
            names = [n for n in missing if n != "utilization" or gpu.load is None]
            names = [n if n != "processes" else "processes, the GPU's memory in use" for n in names]
            if names:
                load = "no load file; " if "utilization" in names else ""
                unread.append(f"{', '.join(names)} ({load}NVML: {why_not or 'not supported'})")
        elif gpu.load is None:
            unread.append("utilization (no load file)")
        if self._thermal is None:
            unread.append("temperature (no thermal zone of type gpu*)")
        if not self._rails:
            unread.append("power (no INA3221 or INA238 rail)")
        return unread

    def close(self) -> None:
        # A read in flight holds the lock, and a stop must not wait for it: the GPU goes at once, and
        # Thor's NVML is shut down only if the sampler lets go of the lock soon (never under its call).
        self._gpu = None
        if self._lock.acquire(timeout=CLOSE_WAIT):
            try:
                if self._thor is not None:
                    self._thor.close()
                    self._thor = None
            finally:
                self._lock.release()

    def healthy(self) -> bool:
        return self._gpu is not None and self._last_up

    # -- reading ---------------------------------------------------------------------------------

    def _int(self, path: Path | None, what: str) -> int | None:
        """An integer attribute; None and a counted error when missing, unreadable or not a number."""
        if path is None:
            return None
        try:
            return int(_read(path).split()[0])
        except (OSError, ValueError, IndexError) as exc:
            self.errors[what] += 1
            log.debug("%s: cannot read %s: %s", what, path, exc)
            return None

    def read(self) -> list[DeviceSample]:
        with self._lock:
            gpu = self._gpu
            if gpu is None:
                return []
            if not gpu.devfreq.is_dir():
                self._last_up = False
                self.errors["devfreq"] += 1
                return [DeviceSample(self._device, False, {}, dict(self._info))]
            values: dict[SeriesKey, float] = {}
            enabled = self._enabled
            folders = self._folders(gpu)
            for group in ("utilization", "clocks", "temperature"):
                if enabled(group):
                    simple.read(SIMPLE_READS[group], lambda row: self._file(folders, row), values, self.errors)
            thor = self._thor
            if thor is not None and enabled("utilization"):
                utilization = thor.utilization() if gpu.load is None else None
                if utilization is not None:
                    values[("utilization", ())] = utilization
                values.update(((key, ()), ratio) for key, ratio in thor.codecs().items())
            if enabled("clocks"):
                self._read_governor(gpu, values)
            if enabled("power"):
                self._read_rails(values)
            if gpu.stack == "nvidia":  # Thor: no nvmap, no nvgpu device nodes; NVML has the processes
                listed = thor.processes() if thor is not None and (enabled("memory") or enabled("processes")) else None
                used = None if listed is None else sum(p.memory_bytes or 0.0 for p in listed)
                if enabled("memory"):
                    self._read_memory(values, None, used)
                processes = self._count_processes(values, listed) if enabled("processes") else ()
                self._last_up = True
                return [DeviceSample(self._device, True, values, dict(self._info), processes)]
            clients = jetson_procs.nvmap_clients(self._sysfs) if enabled("memory") or enabled("processes") else None
            if enabled("memory"):
                self._read_memory(values, clients)
            processes = self._read_processes(values, clients) if enabled("processes") else ()
            self._last_up = True
            return [DeviceSample(self._device, True, values, dict(self._info), processes)]

    def _folders(self, gpu: GpuNode) -> dict[str, Path | None]:
        """The folders SIMPLE_READS names: the GPU device's (its load), its devfreq node, its thermal zone."""
        return {"gpu": gpu.load.parent if gpu.load else None, "devfreq": gpu.devfreq, "thermal": self._thermal}

    def _file(self, folders: dict[str, Path | None], row: Simple) -> int | None:
        folder, attribute = row.args
        base = folders[folder]
        return None if base is None else self._int(base / attribute, row.call)

    def _read_governor(self, gpu: GpuNode, values: dict[SeriesKey, float]) -> None:
        try:
            governor = _read(gpu.devfreq / "governor").split()
        except OSError:
            governor = []
        if len(governor) == 1 and governor[0].isprintable():
            values[("frequency_governor", (governor[0],))] = 1.0
        else:
            self.errors["governor"] += 1

    def _read_rails(self, values: dict[SeriesKey, float]) -> None:
        for rail in self._rails:
            if rail.power is not None:
                raw = self._int(rail.power, "rail")
                watts = None if raw is None else raw / rail.per_watt
            else:
                millivolts = self._int(rail.voltage, "rail")
                milliamps = self._int(rail.current, "rail") if millivolts is not None else None
                watts = None if millivolts is None or milliamps is None else millivolts * milliamps / 1e6
            if watts is None or watts < 0:
                continue
            values[("power_rail", (rail.name,))] = watts
            if rail.name in INPUT_RAILS:
                values[("board_power", ())] = watts
            elif rail.name in GPU_RAILS:
                values[("power", ())] = watts

    def _read_memory(
        self,
        values: dict[SeriesKey, float],
        clients: tuple[dict[int, int], int | None] | None,
        gpu_used: float | None = None,  # Thor: its processes' memory, from NVML
    ) -> None:
        fields: dict[str, int] = {}
        try:
            for line in hostread.read_text(self._procfs / "meminfo", encoding="ascii").splitlines():
                key, _, rest = line.partition(":")
                parts = rest.split()
                if key in _MEMINFO_KEYS and parts and parts[0].isdigit():
                    fields[key] = int(parts[0]) * 1024  # kB
        except OSError as exc:
            log.debug("meminfo: %s", exc)
        if "MemTotal" not in fields or "MemAvailable" not in fields:
            self.errors["meminfo"] += 1
            return
        total, available = fields["MemTotal"], fields["MemAvailable"]
        values[("memory_total", ())] = float(total)
        values[("memory_free", ())] = float(min(available, total))  # what a new allocation can still get
        values[("shared_memory_used", ())] = float(max(0, total - available))
        # the GPU's own use: what its driver has mapped (JetPack 5+), else nvmap's total (root only)
        mapped = fields.get("NvMapMemUsed")
        if mapped is None and clients is not None:
            mapped = clients[1] if clients[1] is not None else sum(clients[0].values())
        if mapped is not None:
            values[("memory_used", ())] = float(min(mapped, total))
        elif gpu_used is not None:
            values[("memory_used", ())] = float(min(gpu_used, total))

    @staticmethod
    def _count_processes(
        values: dict[SeriesKey, float], listed: tuple[ProcessUsage, ...] | None
    ) -> tuple[ProcessUsage, ...]:
        """Thor's GPU processes as NVML lists them; absent (not 0) when NVML does not list them."""
        if listed is None:
            return ()
        values[("processes", ())] = float(len(listed))
        known = [p.memory_bytes for p in listed if p.memory_bytes is not None]
        if known:
            values[("processes_memory", ())] = float(sum(known))
        return listed

    def _read_processes(
        self, values: dict[SeriesKey, float], clients: tuple[dict[int, int], int | None] | None
    ) -> tuple[ProcessUsage, ...]:
        found = self._scanner.scan()
        if found.unreadable and not self._warned_unreadable:
            self._warned_unreadable = True
            log.warning(
                "cannot read the open files of %d processes under %s (another user's): GPU processes and "
                "pods of those are not seen; run the agent as root with CAP_SYS_PTRACE for them",
                found.unreadable,
                self._procfs,
            )
        memory = clients[0] if clients is not None else None
        processes = tuple(
            ProcessUsage(pid, None if memory is None else float(memory.get(pid, 0))) for pid in found.pids
        )
        values[("processes", ())] = float(len(processes))
        if memory is not None:
            values[("processes_memory", ())] = float(sum(memory.get(pid, 0) for pid in found.pids))
        return processes


def create(config: Config) -> JetsonBackend:
    return JetsonBackend(config)
