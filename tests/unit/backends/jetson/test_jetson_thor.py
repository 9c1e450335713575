"""Jetson Thor (JetPack 7) from its sysfs alone: the GPU found by devfreq ``gpu-gpc-0``, its clock, thermal
zone and rails read, and what only NVML has (utilization, processes, the GPU's memory in use) named in one
start-up line when NVML is not there. NVML's side, through the real nvidia-ml-py over the C fake, is in
tests/integration/test_jetpack7_cli.py and the golden pages."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.backends.base import NoDevicesError
from gpu_exporter.backends.jetson import backend as jetson
from gpu_exporter.config import Config
from tests.support import paths

THOR = paths.FIXTURES / "jetson" / "thor"
HWMON = "sys/devices/platform/c240000.i2c/i2c-1"


@pytest.fixture
def no_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML as in a pod without the NVIDIA runtime, whatever this machine has."""

    def missing() -> None:
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


@pytest.fixture
def thor(tmp_path: Path) -> Path:
    """A writable copy of the Thor tree (symlinks kept relative)."""
    root = tmp_path / "thor"
    shutil.copytree(THOR, root, symlinks=True)
    return root


def open_board(root: Path) -> jetson.JetsonBackend:
    backend = jetson.create(Config(path_sysfs=str(root / "sys"), path_procfs=str(root / "proc")))
    backend.open()
    return backend


def start_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("Jetson GPU ")]


def test_thor_gpu_found_by_its_gpc_devfreq_node_and_read_from_sysfs(no_nvml: None) -> None:
    backend = open_board(THOR)
    [s] = backend.read()
    v = s.values
    assert s.up
    assert s.info["name"] == "NVIDIA Jetson AGX Thor Developer Kit (tegra264)"
    assert s.info["memory"] == "shared"
    # the GPC clock domain, not gpu-nvd-0 (the video decoder, which runs at 704 MHz here)
    assert v[("clock_graphics", ())] == 1188e6
    assert v[("clock_max_graphics", ())] == 1575e6
    assert v[("clock_min_graphics", ())] == 306e6
    assert v[("frequency_governor", ("nvhost_podgov",))] == 1
    assert v[("temp_gpu", ())] == pytest.approx(45.937)
    rails = {labels[0]: watts for (key, labels), watts in v.items() if key == "power_rail"}
    assert rails == pytest.approx(
        {"VDD_GPU": 19.968 * 1.102, "VDD_CPU_SOC_MSS": 19.968 * 0.598, "VIN_SYS_5V0": 5.016 * 1.240, "VIN": 50.1408}
    )
    assert v[("board_power", ())] == pytest.approx(50.1408)  # the carrier's INA238, power1_input in µW
    assert v[("power", ())] == pytest.approx(19.968 * 1.102)  # VDD_GPU feeds the GPU (and its codecs)
    # unified memory: the system's RAM; no NvMapMemUsed on the nvidia.ko stack
    assert v[("memory_total", ())] == 128280516 * 1024
    assert v[("memory_free", ())] == 112560144 * 1024
    assert backend.errors == {}


def test_without_nvml_what_only_nvml_gives_is_absent_not_zero_and_named_once(
    no_nvml: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="gpu_exporter.backends.jetson"):
        backend = open_board(THOR)
        [s] = backend.read()
        backend.read()
    for key in ("utilization", "processes", "processes_memory", "memory_used"):
        assert (key, ()) not in s.values  # a scan of /proc would say 0 processes: Thor's are not on nvgpu nodes
    [line] = start_lines(caplog)
    assert "gpu-gpc-0" in line and "rails VDD_GPU, VDD_CPU_SOC_MSS, VIN_SYS_5V0, VIN" in line
    assert "could not read: utilization, processes, the GPU's memory in use (no load file; NVML: " in line
    assert "libnvidia-ml.so.1 not found" in line
    assert [r.levelno for r in caplog.records if r.getMessage() == line] == [logging.WARNING]


def test_a_board_without_sensors_still_has_its_gpu_and_one_line_says_what_is_missing(
    no_nvml: None, thor: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shutil.rmtree(thor / "sys/class/thermal")
    shutil.rmtree(thor / "sys/class/hwmon")
    shutil.rmtree(thor / HWMON)
    with caplog.at_level(logging.INFO, logger="gpu_exporter.backends.jetson"):
        [s] = open_board(thor).read()
    assert s.up and s.values[("clock_graphics", ())] == 1188e6
    [line] = start_lines(caplog)
    assert "temperature (no thermal zone of type gpu*)" in line
    assert "power (no INA3221 or INA238 rail)" in line


def test_thor_found_where_a_container_masks_the_device_tree(no_nvml: None, thor: Path) -> None:
    shutil.rmtree(thor / "sys/firmware")
    (thor / "sys/firmware").mkdir()
    [s] = open_board(thor).read()
    assert s.info["name"] == "NVIDIA Jetson AGX Thor Developer Kit (tegra264)"  # soc0: machine, soc_id 38
    assert s.device.uuid == "jetson-gpu-gpc-0"


def test_the_video_decoder_alone_is_not_a_gpu(no_nvml: None, thor: Path) -> None:
    (thor / "sys/class/devfreq/gpu-gpc-0").unlink()
    with pytest.raises(NoDevicesError, match="no Jetson GPU"):
        open_board(thor)


def test_gpc_node_on_a_board_that_is_not_nvidia_is_not_taken(no_nvml: None, thor: Path) -> None:
    shutil.rmtree(thor / "sys/devices/soc0")
    (thor / "sys/firmware/devicetree/base/compatible").write_text("rockchip,rk3588\0")
    with pytest.raises(NoDevicesError):
        open_board(thor)


def test_input_monitor_named_by_its_hwmon_label(no_nvml: None, thor: Path) -> None:
    (thor / HWMON / "1-0044/hwmon/hwmon2/label").write_text("VIN_CARRIER\n")
    [s] = open_board(thor).read()
    assert s.values[("power_rail", ("VIN_CARRIER",))] == pytest.approx(50.1408)
    assert ("board_power", ()) not in s.values  # not an input rail by name
