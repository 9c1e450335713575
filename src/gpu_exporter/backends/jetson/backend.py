"""NVIDIA Jetson (Nano, TX2, Xavier, Orin) through sysfs and procfs only: no NVML, no tegrastats.

The integrated GPU is found by its devfreq node (``class/devfreq/*`` whose ``device/of_node/name`` is a
known GPU, or whose name ends in ``.gpu``), which also gives the clock and governor. Container runtimes
mask ``/sys/firmware``, so the device tree (``of_node``) may be unreadable: then the SoC's own sysfs
entry (``devices/soc0/family`` is ``Tegra``) vouches for a node called ``*.gpu``. The load (0-1000)
sits in the GPU device's folder. Temperatures come from the thermal zone whose type starts with
``GPU``, power from the INA3221 rail monitors (hwmon on JetPack 5+, IIO on JetPack 4). The GPU shares
system RAM: its memory is what the GPU driver has mapped (``jetson_procs``), next to the shared RAM in
use from ``/proc/meminfo``; its processes are those that hold the GPU's device nodes open. Every path is under ``--path.sysfs`` and
``--path.procfs``, so the same code reads a fixture tree in tests.

A file that is missing, unreadable or holds garbage makes that one value absent and counts an error
under the name of what was read (``load``, ``rail``...): a broken tree never fails the cycle.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import hostread
from gpu_exporter.backends import simple
from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.jetson import procs as jetson_procs
from gpu_exporter.backends.simple import Simple
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceId, DeviceSample, ProcessUsage, SeriesKey

__all__ = ["JetsonBackend", "create", "find_gpu"]

log = logging.getLogger("gpu_exporter.backends.jetson")  # the name its log lines have always had

# device-tree node names of Jetson GPUs: gm20b (Nano, TX1), gp10b (TX2), gv11b (Xavier), ga10b (Orin)
CHIP_NAMES = frozenset({"gm20b", "gp10b", "gv11b", "ga10b"})
# a node merely called "gpu" (Nano, Orin on JetPack 6) is also what Mali boards (Rockchip, Allwinner)
# call theirs, so it counts only when the device tree says NVIDIA
GPU_NODE_NAMES = CHIP_NAMES | {"gpu"}
INPUT_RAILS = ("VDD_IN", "VIN", "POM_5V_IN")  # the whole module's input
GPU_RAILS = ("GPU", "VDD_GPU", "POM_5V_GPU")  # rails that feed the GPU alone
# the GPU driver a Jetson's devfreq device is bound to (nvgpu registers its platform driver as gk20a)
GPU_DRIVERS = frozenset({"gk20a", "nvgpu"}) | CHIP_NAMES
# ``devices/soc0/soc_id`` of Tegra SoCs (the chip ID in decimal) -> their GPU
SOC_CHIPS = {"33": "gm20b", "24": "gp10b", "25": "gv11b", "35": "ga10b"}
# load files for boards whose devfreq device is not the folder that holds ``load`` (Nano, TX1)
_LEGACY_LOAD = ("devices/gpu.0/load", "devices/platform/gpu.0/load")
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


def _read(path: Path) -> str:
    """A sysfs attribute as text, without device-tree NUL terminators or the trailing newline.

    Bounded (``hostread``): a FIFO, a device, an endless file or a read that hangs raise OSError."""
    return hostread.read_text(path).replace("\x00", " ").strip()


def _first_word(path: Path) -> str:
    try:
        return _read(path).split(" ")[0]
    except OSError:
        return ""


@dataclass(frozen=True)
class GpuNode:
    devfreq: Path  # class/devfreq/<node>
    chip: str  # gm20b, gv11b, ga10b...
    load: Path | None


@dataclass(frozen=True)
class Rail:
    name: str
    power: Path | None  # IIO in_power<N>_input, milliwatts
    voltage: Path | None  # hwmon in<N>_input, millivolts
    current: Path | None  # hwmon curr<N>_input, milliamperes


def find_gpu(sysfs: Path) -> GpuNode | None:
    """The Jetson GPU's devfreq node under ``sysfs``, or None."""
    devfreq = sysfs / "class" / "devfreq"
    try:
        entries = sorted(devfreq.iterdir())
    except OSError:
        return None
    tegra = _first_word(sysfs / "devices" / "soc0" / "family") == "Tegra"
    for entry in entries:
        of_node = entry / "device" / "of_node"
        node_name = _first_word(of_node / "name")
        suffix = entry.name.rpartition(".")[2]
        driver = _link_name(entry / "device" / "driver")
        if node_name not in GPU_NODE_NAMES and suffix not in GPU_NODE_NAMES and not (tegra and driver in GPU_DRIVERS):
            continue
        compatible = _first_word(of_node / "compatible")  # "nvidia,ga10b" or "nvidia,tegra210-gm20b"
        named_chip = node_name in CHIP_NAMES or suffix in CHIP_NAMES
        if not named_chip and not tegra and not _is_nvidia(sysfs, compatible):
            log.debug("devfreq %s is a GPU but not an NVIDIA one (%s)", entry.name, compatible or "?")
            continue
        if tegra and compatible and not compatible.startswith("nvidia,"):
            continue  # another vendor's GPU next to a Tegra (not known to exist, but never take it)
        chip = compatible.partition(",")[2].rpartition("-")[2] if "," in compatible else ""
        if not chip and suffix in CHIP_NAMES:
            chip = suffix
        if not chip and node_name in CHIP_NAMES:
            chip = node_name
        if not chip and tegra:  # the device tree is masked: the SoC names the GPU
            chip = SOC_CHIPS.get(_first_word(sysfs / "devices" / "soc0" / "soc_id"), "")
        chip = chip or node_name or entry.name
        load: Path | None = None
        for candidate in (entry / "device" / "load", *(sysfs / p for p in _LEGACY_LOAD)):
            if candidate.exists():
                load = candidate
                break
        return GpuNode(entry, chip, load)
    return None


def _link_name(path: Path) -> str:
    """The last element of a symlink's target (``device/driver`` -> ``gk20a``), or ""."""
    try:
        return os.readlink(path).rstrip("/").rpartition("/")[2]
    except OSError:
        return ""


def _is_nvidia(sysfs: Path, compatible: str) -> bool:
    """The GPU node, or failing that the board, is NVIDIA's according to the device tree."""
    if compatible:
        return compatible.startswith("nvidia,")
    board = _safe_read(sysfs / "firmware" / "devicetree" / "base" / "compatible")
    return "nvidia," in board


def _monitors(sysfs: Path, patterns: tuple[str, ...]) -> list[Path]:
    """INA3221 monitor folders matching the glob patterns, each once, in a stable order."""
    seen: dict[str, Path] = {}
    for pattern in patterns:
        for folder in sorted(sysfs.glob(pattern)):
            if _first_word(folder / "name").startswith("ina3221"):
                seen.setdefault(os.path.realpath(folder), folder)
    return list(seen.values())


def find_rails(sysfs: Path) -> list[Rail]:
    """Named supply rails of every INA3221 on the board (JetPack 5+ hwmon, JetPack 4 IIO)."""
    rails: list[Rail] = []
    for folder in _monitors(sysfs, ("class/hwmon/hwmon*", "bus/i2c/devices/*/hwmon/hwmon*")):
        for label in sorted(folder.glob("in*_label")):
            channel = label.name[2 : -len("_label")]
            name = _first_word(label) if channel.isdigit() else ""
            if not name or "sum of shunt" in _safe_read(label).lower():
                continue
            rails.append(Rail(name, None, folder / f"in{channel}_input", folder / f"curr{channel}_input"))
    for folder in _monitors(sysfs, ("bus/iio/devices/iio:device*", "bus/i2c/devices/*/iio:device*")):
        for label in sorted(folder.glob("rail_name_*")):
            channel = label.name.rpartition("_")[2]
            name = _first_word(label)
            if name and channel.isdigit():
                rails.append(Rail(name, folder / f"in_power{channel}_input", None, None))
    return rails


def _safe_read(path: Path) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def find_gpu_thermal_zone(sysfs: Path) -> Path | None:
    for zone in sorted((sysfs / "class" / "thermal").glob("thermal_zone*")):
        if _safe_read(zone / "type").lower().startswith("gpu"):
            return zone
    return None


class JetsonBackend:
    """The one integrated GPU of a Jetson module."""

    name = "jetson"

    def __init__(self, config: Config) -> None:
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
            self._last_up = True
        log.info(
            "Jetson GPU %s at %s: load %s, thermal zone %s, rails %s",
            gpu.chip,
            gpu.devfreq,
            "yes" if gpu.load else "not found",
            self._thermal.name if self._thermal else "not found",
            ", ".join(r.name for r in self._rails) or "not found",
        )

    def close(self) -> None:
        # not under the lock: a read in flight holds it, and a stop must not wait for that read
        self._gpu = None

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
            if enabled("clocks"):
                self._read_governor(gpu, values)
            if enabled("power"):
                self._read_rails(values)
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
                milliwatts = self._int(rail.power, "rail")
                watts = None if milliwatts is None else milliwatts / 1000
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

    def _read_memory(self, values: dict[SeriesKey, float], clients: tuple[dict[int, int], int | None] | None) -> None:
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
