"""Where a Jetson keeps its GPU: the devfreq node, the load file, the GPU thermal zone and the power rails.

Discovery only, for the backend (``jetson/backend.py``) and the doctor; every file is read through
``hostread``, so a missing, hostile or hung file makes that one thing not found, never an exception or a
stall.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpu_exporter import hostread

log = logging.getLogger("gpu_exporter.backends.jetson")

__all__ = [
    "GPU_RAILS",
    "INPUT_RAILS",
    "GpuNode",
    "Rail",
    "_read",
    "_safe_read",
    "find_gpu",
    "find_gpu_thermal_zone",
    "find_rails",
]

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
SOC_CHIPS = {"33": "gm20b", "24": "gp10b", "25": "gv11b", "35": "ga10b", "38": "tegra264"}
# Thor's GPU clock domains (JetPack 7); ``gpu-nvd-<N>`` beside them is the video decoder, not the GPU
_THOR_NODE = re.compile(r"gpu-gpc-[0-9]+")
INPUT_MONITOR = "ina238"  # Thor's carrier board: one channel on the board's input, power in microwatts
# load files for boards whose devfreq device is not the folder that holds ``load`` (Nano, TX1)
_LEGACY_LOAD = ("devices/gpu.0/load", "devices/platform/gpu.0/load")


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
    chip: str  # gm20b, gv11b, ga10b..., tegra264 (Thor: the SoC, its GPU has no device-tree name)
    load: Path | None
    stack: str = "nvgpu"  # the GPU driver: nvgpu, or nvidia (nvidia.ko, Thor), whose NVML answers


@dataclass(frozen=True)
class Rail:
    name: str
    power: Path | None  # IIO in_power<N>_input (milliwatts), INA238 power1_input (microwatts)
    voltage: Path | None  # hwmon in<N>_input, millivolts
    current: Path | None  # hwmon curr<N>_input, milliamperes
    per_watt: float = 1000  # units of ``power`` in a watt


def find_gpu(sysfs: Path) -> GpuNode | None:
    """The Jetson GPU's devfreq node under ``sysfs``, or None."""
    devfreq = sysfs / "class" / "devfreq"
    try:
        entries = sorted(devfreq.iterdir())
    except OSError:
        return None
    tegra = _first_word(sysfs / "devices" / "soc0" / "family") == "Tegra"
    thor = _find_thor(sysfs, entries, tegra)
    if thor is not None:
        return thor
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


def _find_thor(sysfs: Path, entries: list[Path], tegra: bool) -> GpuNode | None:
    """Jetson Thor's GPU: its first ``gpu-gpc-<N>`` devfreq node on a Tegra (or an NVIDIA device tree).

    The node has no device-tree name of the kind the older GPUs have, so the SoC names the chip: the
    board's ``compatible`` (``nvidia,tegra264``), or where the device tree is masked ``soc0/soc_id``.
    """
    board = _safe_read(sysfs / "firmware" / "devicetree" / "base" / "compatible")
    if not tegra and "nvidia," not in board:
        return None
    for entry in entries:
        if _THOR_NODE.fullmatch(entry.name):
            socs = [word.partition(",")[2] for word in board.split() if word.startswith("nvidia,tegra")]
            soc_id = _first_word(sysfs / "devices" / "soc0" / "soc_id")
            chip = socs[-1] if socs else SOC_CHIPS.get(soc_id, entry.name)
            load = next((c for c in (entry / "load", entry / "device" / "load") if c.exists()), None)
            return GpuNode(entry, chip, load, stack="nvidia")
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


def _monitors(sysfs: Path, patterns: tuple[str, ...], chip: str = "ina3221") -> list[Path]:
    """Monitor folders (INA3221 by default) matching the glob patterns, each once, in a stable order."""
    seen: dict[str, Path] = {}
    for pattern in patterns:
        for folder in sorted(sysfs.glob(pattern)):
            if _first_word(folder / "name").startswith(chip):
                seen.setdefault(os.path.realpath(folder), folder)
    return list(seen.values())


def find_rails(sysfs: Path) -> list[Rail]:
    """Named supply rails of every INA3221 on the board (JetPack 5+ hwmon, JetPack 4 IIO), then Thor's INA238.

    A channel labelled ``NC`` is not connected (AGX Orin's second monitor), and "sum of shunt voltages" is
    no rail. The INA238 has one channel, the input of NVIDIA's Thor carrier board: named by its hwmon
    ``label`` where the device tree gives one, else ``VIN``.
    """
    rails: list[Rail] = []
    hwmon = ("class/hwmon/hwmon*", "bus/i2c/devices/*/hwmon/hwmon*")
    for folder in _monitors(sysfs, hwmon):
        for label in sorted(folder.glob("in*_label")):
            channel = label.name[2 : -len("_label")]
            name = _first_word(label) if channel.isdigit() else ""
            if not name or name == "NC" or "sum of shunt" in _safe_read(label).lower():
                continue
            rails.append(Rail(name, None, folder / f"in{channel}_input", folder / f"curr{channel}_input"))
    for folder in _monitors(sysfs, ("bus/iio/devices/iio:device*", "bus/i2c/devices/*/iio:device*")):
        for label in sorted(folder.glob("rail_name_*")):
            channel = label.name.rpartition("_")[2]
            name = _first_word(label)
            if name and channel.isdigit():
                rails.append(Rail(name, folder / f"in_power{channel}_input", None, None))
    for folder in _monitors(sysfs, hwmon, INPUT_MONITOR):
        rails.append(Rail(_first_word(folder / "label") or "VIN", folder / "power1_input", None, None, 1e6))
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
