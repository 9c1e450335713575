"""Jetson detection inside a container, where the runtime masks /sys/firmware (an empty folder).

Every ``of_node`` link then dangles, so the device tree cannot say which devfreq node is NVIDIA's GPU;
``devices/soc0/family`` (``Tegra``) and ``soc_id`` must, and a Mali ``*.gpu`` elsewhere must still be
refused.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpu_exporter.backends.base import NoDevicesError
from gpu_exporter.backends.jetson import backend as jetson
from gpu_exporter.config import Config
from tests.support import paths

FIXTURES = paths.FIXTURES / "jetson"
# board -> (chip, machine name from soc0)
BOARDS = {
    "nano": ("gm20b", "NVIDIA Jetson Nano Developer Kit"),
    "xavier": ("gv11b", "Jetson-AGX"),
    "orin-jp5": ("ga10b", "NVIDIA Jetson Orin Nano Developer Kit"),
    "orin-jp6": ("ga10b", "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"),
    "orin-jp7": ("ga10b", "NVIDIA Jetson AGX Orin Developer Kit"),
}


def masked_copy(tmp_path: Path, board: str) -> Path:
    root = tmp_path / board
    shutil.copytree(FIXTURES / board, root, symlinks=True)
    shutil.rmtree(root / "sys" / "firmware")
    (root / "sys" / "firmware").mkdir()  # what runc leaves: an empty, read-only folder
    return root


def open_board(root: Path) -> jetson.JetsonBackend:
    backend = jetson.create(Config(path_sysfs=str(root / "sys"), path_procfs=str(root / "proc")))
    backend.open()
    return backend


@pytest.mark.parametrize("board", BOARDS)
def test_gpu_found_with_the_device_tree_masked(tmp_path: Path, board: str) -> None:
    root = masked_copy(tmp_path, board)
    gpu_link = next((root / "sys/class/devfreq").iterdir()) / "device" / "of_node"
    assert gpu_link.is_symlink() and not gpu_link.exists()  # the link dangles, as in a pod
    backend = open_board(root)
    [masked] = backend.read()
    [plain] = open_board(FIXTURES / board).read()
    chip, machine = BOARDS[board]
    assert masked.up
    assert masked.info["name"] == f"{machine} ({chip})"
    # the same readings as on the host; only the identity that lives in the device tree is gone
    assert dict(masked.values.items()) == dict(plain.values.items())
    assert "serial" not in masked.info
    assert backend.errors == {}


def _mali_board(root: Path, family: str | None) -> None:
    devices = root / "sys/devices/platform/ff9a0000.gpu"
    (devices / "devfreq/ff9a0000.gpu").mkdir(parents=True)
    (devices / "devfreq/ff9a0000.gpu/cur_freq").write_text("800000000\n")
    (devices / "of_node").symlink_to("../../../firmware/devicetree/base/gpu@ff9a0000")  # masked: dangles
    (devices / "devfreq/ff9a0000.gpu/device").symlink_to("../../../ff9a0000.gpu")
    (root / "sys/firmware").mkdir(parents=True)
    (root / "sys/class/devfreq").mkdir(parents=True)
    (root / "sys/class/devfreq/ff9a0000.gpu").symlink_to("../../devices/platform/ff9a0000.gpu/devfreq/ff9a0000.gpu")
    if family is not None:
        (root / "sys/devices/soc0").mkdir(parents=True)
        (root / "sys/devices/soc0/family").write_text(f"{family}\n")


@pytest.mark.parametrize("family", [None, "rockchip", "Amlogic Meson"])
def test_mali_gpu_with_the_device_tree_masked_is_refused(tmp_path: Path, family: str | None) -> None:
    _mali_board(tmp_path, family)
    backend = jetson.create(Config(path_sysfs=str(tmp_path / "sys"), path_procfs=str(tmp_path / "proc")))
    with pytest.raises(NoDevicesError, match="no Jetson GPU"):
        backend.open()


def test_a_devfreq_node_bound_to_the_gpu_driver_counts_on_a_tegra(tmp_path: Path) -> None:
    """A GPU devfreq node whose name says nothing (a vendor kernel's rename) is known by its driver."""
    root = masked_copy(tmp_path, "orin-jp6")
    device = root / "sys/devices/platform/bus@0/17000000.gpu"
    (root / "sys/class/devfreq/17000000.gpu").unlink()
    (device / "devfreq/17000000.gpu").rename(device / "devfreq/gpu-scaling")
    (root / "sys/class/devfreq/gpu-scaling").symlink_to("../../devices/platform/bus@0/17000000.gpu/devfreq/gpu-scaling")
    (root / "sys/bus/platform/drivers/gk20a").mkdir(parents=True)
    (device / "driver").symlink_to("../../../../bus/platform/drivers/gk20a")
    backend = open_board(root)
    [sample] = backend.read()
    assert sample.info["name"].endswith("(ga10b)")
    assert sample.values[("clock_graphics", ())] == 918e6
