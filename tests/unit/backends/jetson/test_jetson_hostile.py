"""A Jetson tree whose files are not what they seem: a FIFO as the GPU load or a rail, /dev/zero or an
endless file as /proc/meminfo or nvmap's clients, a rail whose read blocks in the kernel (a hung I2C
bus). Each costs the one value it holds (counted), and the rest of the sample is read as usual."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter import hostread
from gpu_exporter.backends.jetson import backend as jetson
from gpu_exporter.backends.jetson import procs as jetson_procs
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceSample
from tests.support import paths, wait_until
from tests.support.fuse import HungFile, available

HWMON = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
LOAD = "sys/devices/platform/bus@0/17000000.gpu/load"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    dest = tmp_path / "orin-jp6"
    shutil.copytree(paths.FIXTURES / "jetson" / "orin-jp6", dest, symlinks=True)
    return dest


def opened(root: Path) -> jetson.JetsonBackend:
    backend = jetson.create(Config(gpu_vendor="jetson", path_sysfs=str(root / "sys"), path_procfs=str(root / "proc")))
    backend.open()
    return backend


def read(backend: jetson.JetsonBackend) -> DeviceSample:
    [sample] = backend.read()
    assert sample.up
    return sample


def fifo(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def test_a_fifo_as_the_gpu_load_costs_the_load_alone(root: Path) -> None:
    backend = opened(root)
    fifo(root / LOAD)
    before = hostread.failures()["not_regular"]
    sample = read(backend)
    assert ("utilization", ()) not in sample.values
    assert sample.values[("clock_graphics", ())] == 918e6
    assert ("power_rail", ("VDD_IN",)) in sample.values
    assert backend.errors["load"] == 1
    assert hostread.failures()["not_regular"] == before + 1


def test_a_fifo_rail_with_a_silent_writer_costs_that_rail_alone(root: Path) -> None:
    backend = opened(root)
    writer = os.open(fifo(root / HWMON / "curr2_input"), os.O_RDWR)  # open, never written
    try:
        sample = read(backend)
        read(backend)
    finally:
        os.close(writer)
    assert ("power_rail", ("VDD_CPU_GPU_CV",)) not in sample.values
    assert sample.values[("power_rail", ("VDD_IN",))] == pytest.approx(5.064 * 2.744)
    assert ("utilization", ()) in sample.values
    assert backend.errors["rail"] == 2


@pytest.mark.parametrize("kind", ["/dev/zero", "endless"])
def test_meminfo_that_never_ends_costs_the_memory_values_alone(root: Path, kind: str) -> None:
    meminfo = root / "proc" / "meminfo"
    meminfo.unlink()
    if kind == "/dev/zero":
        meminfo.symlink_to("/dev/zero")
    else:
        with open(meminfo, "wb") as handle:
            handle.truncate(64 << 30)  # 64 GiB of NULs, sparse: one endless line
    backend = opened(root)
    sample = read(backend)
    for key in ("memory_total", "memory_free", "shared_memory_used", "memory_used"):
        assert (key, ()) not in sample.values
    assert ("utilization", ()) in sample.values
    assert backend.errors["meminfo"] == 1


def test_nvmap_clients_as_dev_zero_cost_the_per_process_memory_alone(root: Path) -> None:
    clients = root.joinpath("sys", *jetson_procs.NVMAP_CLIENTS)
    clients.unlink()
    clients.symlink_to("/dev/zero")
    assert jetson_procs.nvmap_clients(root / "sys") is None
    sample = read(opened(root))
    assert [p.pid for p in sample.processes] == [1500, 2101, 2205, 2206]
    assert all(p.memory_bytes is None for p in sample.processes)
    assert ("processes_memory", ()) not in sample.values
    assert sample.values[("memory_used", ())] == 385024 * 1024  # NvMapMemUsed, from meminfo


@pytest.fixture
def hung_rail(root: Path) -> Iterator[HungFile]:
    why = available()
    if why:
        pytest.skip(why)
    with HungFile(root / HWMON / "curr2_input") as hung:
        yield hung


def test_a_rail_whose_read_hangs_in_the_kernel_costs_that_rail_and_one_wait(root: Path, hung_rail: HungFile) -> None:
    backend = opened(root)
    before = hostread.failures()
    for _ in range(3):
        sample = read(backend)
        assert ("power_rail", ("VDD_CPU_GPU_CV",)) not in sample.values
        assert ("power_rail", ("VDD_SOC",)) in sample.values
        assert ("utilization", ()) in sample.values
    after = hostread.failures()
    assert hung_rail.reads == 1  # the later cycles did not try it again: refused at once, as stuck
    assert after["timeout"] > before["timeout"] and after["stuck"] - before["stuck"] >= 2
    assert backend.errors["rail"] == 3


def test_close_does_not_wait_for_a_read_in_flight(
    root: Path, hung_rail: HungFile, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostread, "TIMEOUT", 30.0)  # the read in flight lasts long past close()
    backend = opened(root)
    reading = threading.Thread(target=backend.read, daemon=True)
    reading.start()
    wait_until(lambda: hung_rail.reads == 1, 10, "the read to reach the hung rail")
    backend.close()
    assert reading.is_alive(), "the read ended before close() returned: nothing was shown"
    assert not backend.healthy()
    hung_rail.stop()  # ends the read
    reading.join(10)
    assert not reading.is_alive()
