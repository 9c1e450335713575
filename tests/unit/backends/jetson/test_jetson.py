"""The Jetson backend reading checked-in sysfs/procfs trees of four boards through --path.sysfs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.jetson import backend as jetson
from gpu_exporter.config import Config
from tests.support import paths

FIXTURES = paths.FIXTURES / "jetson"
BOARDS = ("nano", "xavier", "xavier-jp4", "orin-jp5", "orin-jp6", "orin-jp7")


def config_for(root: Path) -> Config:
    return Config(gpu_vendor="jetson", path_sysfs=str(root / "sys"), path_procfs=str(root / "proc"))


def read_board(root: Path):
    backend = jetson.create(config_for(root))
    backend.open()
    [sample] = backend.read()
    return backend, sample


@pytest.fixture
def tree(tmp_path):
    """A writable copy of a board's tree (symlinks kept relative), for breaking it."""

    def copy(board: str) -> Path:
        dest = tmp_path / board
        shutil.copytree(FIXTURES / board, dest, symlinks=True)
        return dest

    return copy


# expected readings per board: what the fixture files say, in base units
EXPECTED = {
    "nano": {
        "chip": "gm20b",
        "load": 0.532,
        "freq": (921.6e6, 76.8e6, 921.6e6),
        "temp": 34.0,
        "rails": {"POM_5V_IN": 3.987, "POM_5V_GPU": 1.234, "POM_5V_CPU": 0.876},
        "board": 3.987,
        "gpu_power": 1.234,
        "mem_total_kb": 4059272,
        "mem_avail_kb": 2871436,
        "gpu_mapped_kb": 36864,
    },
    "xavier": {
        "chip": "gv11b",
        "load": 0.998,
        "freq": (1377e6, 114.75e6, 1377e6),
        "temp": 44.0,
        "rails": {
            "GPU": 19.2 * 1.5,
            "CPU": 19.2 * 0.25,
            "SOC": 19.2 * 0.42,
            "CV": 0.0,
            "VDDRQ": 19.2 * 0.11,
            "SYS5V": 4.96 * 0.62,
        },
        "board": None,
        "gpu_power": 28.8,
        "mem_total_kb": 31918508,
        "mem_avail_kb": 28311624,
        "gpu_mapped_kb": 1843200,
    },
    "xavier-jp4": {
        "chip": "gv11b",
        "load": 0.998,
        "freq": (1377e6, 114.75e6, 1377e6),
        "temp": 44.0,
        "rails": {"GPU": 9.12, "CPU": 1.216, "SOC": 2.736, "CV": 0.0, "VDDRQ": 0.912, "SYS5V": 2.48},
        "board": None,
        "gpu_power": 9.12,
        "mem_total_kb": 31918508,
        "mem_avail_kb": 28311624,
        "gpu_mapped_kb": 741376,  # nvmap's debugfs total: JetPack 4 has no NvMapMemUsed
    },
    "orin-jp5": {
        "chip": "ga10b",
        "load": 0.0,
        "freq": (624.75e6, 306e6, 624.75e6),
        "temp": 46.218,
        "rails": {"VDD_IN": 5.032 * 1.208, "VDD_CPU_GPU_CV": 5.032 * 0.248, "VDD_SOC": 5.032 * 0.344},
        "board": 5.032 * 1.208,
        "gpu_power": None,
        "mem_total_kb": 7824300,
        "mem_avail_kb": 5678900,
        "gpu_mapped_kb": 524288,
    },
    "orin-jp6": {
        "chip": "ga10b",
        "load": 0.447,
        "freq": (918e6, 306e6, 918e6),
        "temp": 50.906,
        "rails": {"VDD_IN": 5.064 * 2.744, "VDD_CPU_GPU_CV": 5.064 * 0.960, "VDD_SOC": 5.064 * 0.544},
        "board": 5.064 * 2.744,
        "gpu_power": None,
        "mem_total_kb": 15655960,
        "mem_avail_kb": 12120024,
        "gpu_mapped_kb": 385024,
    },
    # AGX Orin, JetPack 7.2: the JetPack 6 layout; two INA3221, the second's outer channels NC (no rail)
    "orin-jp7": {
        "chip": "ga10b",
        "load": 0.612,
        "freq": (1300.5e6, 306e6, 1300.5e6),
        "temp": 47.531,
        "rails": {
            "VDD_GPU_SOC": 19.984 * 0.396,
            "VDD_CPU_CV": 19.984 * 0.208,
            "VIN_SYS_5V0": 5.032 * 0.736,
            "VDDQ_VDD2_1V8AO": 5.008 * 0.128,
        },
        "board": None,
        "gpu_power": None,  # VDD_GPU_SOC feeds the SoC too
        "mem_total_kb": 64335836,
        "mem_avail_kb": 55870188,
        "gpu_mapped_kb": 761856,
    },
}


@pytest.mark.parametrize("board", BOARDS)
def test_board_layout_reads_every_value(board):
    want = EXPECTED[board]
    backend, s = read_board(FIXTURES / board)
    v = s.values
    assert s.up
    assert v[("utilization", ())] == pytest.approx(want["load"])
    cur, low, high = want["freq"]
    assert v[("clock_graphics", ())] == cur
    assert v[("clock_min_graphics", ())] == low
    assert v[("clock_max_graphics", ())] == high
    assert v[("frequency_governor", ("nvhost_podgov",))] == 1
    assert v[("temp_gpu", ())] == pytest.approx(want["temp"])
    rails = {labels[0]: watts for (key, labels), watts in v.items() if key == "power_rail"}
    assert rails == pytest.approx(want["rails"])
    assert v.get(("board_power", ())) == pytest.approx(want["board"])
    # gpu_power_watts only where a rail feeds the GPU alone; Orin's CPU+GPU+CV rail is not the GPU's
    assert v.get(("power", ())) == pytest.approx(want["gpu_power"])
    assert v[("memory_total", ())] == want["mem_total_kb"] * 1024
    # the GPU's memory is what its driver mapped; the whole system's use of the shared RAM is separate
    assert v[("memory_used", ())] == want["gpu_mapped_kb"] * 1024
    assert v[("shared_memory_used", ())] == (want["mem_total_kb"] - want["mem_avail_kb"]) * 1024
    assert v[("memory_free", ())] == want["mem_avail_kb"] * 1024  # what a new allocation can still get
    assert s.info["memory"] == "shared" and s.info["vendor"] == "nvidia"
    assert s.info["name"].endswith(f"({want['chip']})")
    assert s.device.gpu == "0" and s.device.uuid.startswith("jetson-")
    assert "\x00" not in s.info["name"] + s.info["serial"]
    assert backend.errors == {}
    assert backend.healthy()


def test_orin_powered_off_cv_zones_do_not_hide_the_gpu_zone(tree):
    root = tree("orin-jp6")
    # make the first zone a GPU zone that reads the -256 °C "no reading" value
    (root / "sys/class/thermal/thermal_zone0/type").write_text("gpu-thermal\n")
    (root / "sys/class/thermal/thermal_zone0/temp").write_text("-256000\n")
    _, s = read_board(root)
    assert ("temp_gpu", ()) not in s.values


def test_missing_load_and_rail_files_are_absent_and_counted(tree):
    root = tree("orin-jp6")
    backend = jetson.create(config_for(root))
    backend.open()
    (root / "sys/devices/platform/bus@0/17000000.gpu/load").unlink()
    hw = root / "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
    (hw / "curr2_input").unlink()
    [s] = backend.read()
    assert s.up
    assert ("utilization", ()) not in s.values
    assert ("power_rail", ("VDD_CPU_GPU_CV",)) not in s.values
    assert s.values[("power_rail", ("VDD_IN",))] == pytest.approx(5.064 * 2.744)  # the rest still read
    assert s.values[("clock_graphics", ())] == 918e6
    assert backend.errors == {"load": 1, "rail": 1}
    backend.read()
    assert backend.errors == {"load": 2, "rail": 2}  # counted per cycle, never raised


def test_garbage_contents_are_absent_and_counted(tree):
    root = tree("xavier")
    dev = root / "sys/devices/17000000.gv11b"
    (dev / "load").write_text("busy\n")
    (dev / "devfreq/17000000.gv11b/cur_freq").write_text("\n")
    (dev / "devfreq/17000000.gv11b/governor").write_text("\x00\x01 two words\n")
    (root / "sys/class/thermal/thermal_zone1/temp").write_text("hot")
    (root / "proc/meminfo").write_text("MemTotal: lots\n")
    backend, s = read_board(root)
    for key in ("utilization", "clock_graphics", "temp_gpu", "memory_total", "memory_used", "memory_free"):
        assert (key, ()) not in s.values
    assert not any(k == "frequency_governor" for k, _ in s.values)
    assert s.values[("clock_max_graphics", ())] == 1377e6
    assert backend.errors == {"load": 1, "cur_freq": 1, "governor": 1, "temperature": 1, "meminfo": 1}


def test_load_out_of_range_is_rejected(tree):
    root = tree("xavier")
    (root / "sys/devices/17000000.gv11b/load").write_text("1500\n")
    backend, s = read_board(root)
    assert ("utilization", ()) not in s.values
    assert backend.errors["load"] == 1


def test_unreadable_file_is_absent_and_counted(tree):
    """Permission denied cannot be staged as root (root reads mode-000 files), so an attribute that
    cannot be opened is staged as a directory where the file should be: open() fails with an OSError
    (EISDIR) on the same code path EACCES takes."""
    root = tree("nano")
    load = root / "sys/devices/gpu.0/load"
    load.unlink()
    load.mkdir()
    iio = root / "sys/devices/7000c400.i2c/i2c-6/6-0040/iio:device0"
    (iio / "in_power1_input").unlink()
    (iio / "in_power1_input").mkdir()
    backend, s = read_board(root)
    assert ("utilization", ()) not in s.values
    assert ("power", ()) not in s.values
    assert s.values[("board_power", ())] == pytest.approx(3.987)
    assert backend.errors == {"load": 1, "rail": 1}


def test_gpu_node_that_disappears_marks_the_device_down(tree):
    root = tree("orin-jp5")
    backend = jetson.create(config_for(root))
    backend.open()
    shutil.rmtree(root / "sys/devices/17000000.ga10b")
    [s] = backend.read()
    assert not s.up and s.values == {}
    assert s.info["memory"] == "shared"
    assert not backend.healthy()


def test_not_a_jetson_is_no_devices(tmp_path):
    (tmp_path / "sys/class/devfreq/ff9a0000.gpu-not").mkdir(parents=True)
    (tmp_path / "sys/class/devfreq/dmc").mkdir(parents=True)
    backend = jetson.create(config_for(tmp_path))
    with pytest.raises(NoDevicesError, match="no Jetson GPU under"):
        backend.open()


def test_path_that_is_not_sysfs_is_one_line_error(tmp_path):
    backend = jetson.create(config_for(tmp_path / "nowhere"))
    with pytest.raises(BackendError, match="does not look like sysfs") as info:
        backend.open()
    assert "\n" not in str(info.value)


def test_disabled_collectors_leave_their_files_alone(tree):
    root = tree("orin-jp6")
    (root / "proc/meminfo").unlink()  # would count an error if it were read
    config = Config(
        path_sysfs=str(root / "sys"),
        path_procfs=str(root / "proc"),
        disabled_collectors=frozenset({"memory", "power"}),
    )
    backend = jetson.create(config)
    backend.open()
    [s] = backend.read()
    assert not any(k in ("memory_total", "power_rail", "board_power") for k, _ in s.values)
    assert s.values[("utilization", ())] == pytest.approx(0.447)
    assert backend.errors == {}


ATTRIBUTES = (
    "sys/devices/platform/bus@0/17000000.gpu/load",
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/cur_freq",
    "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/governor",
    "sys/class/thermal/thermal_zone1/temp",
    "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1/in1_input",
    "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1/curr1_input",
    "proc/meminfo",
)


def test_any_file_contents_give_sane_values_or_counted_errors(tmp_path_factory):
    """Whatever bytes the attribute files hold, read() returns finite, in-range values and never raises."""
    root = tmp_path_factory.mktemp("fuzz") / "orin-jp6"
    shutil.copytree(FIXTURES / "orin-jp6", root, symlinks=True)
    backend = jetson.create(config_for(root))
    backend.open()

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(ATTRIBUTES), st.binary(max_size=40))
    def check(attribute, content):
        (root / attribute).write_bytes(content)
        [s] = backend.read()
        assert s.up
        for (key, labels), value in s.values.items():
            assert value == value and abs(value) != float("inf"), (key, value)
            if key == "utilization":
                assert 0 <= value <= 1
            if key == "frequency_governor":
                assert len(labels) == 1 and labels[0] and labels[0].isprintable()
        shutil.copy2(FIXTURES / "orin-jp6" / attribute, root / attribute)

    check()


def test_mali_gpu_on_another_arm_board_is_not_taken_for_a_jetson(tmp_path):
    """Rockchip boards also name their devfreq GPU node ``*.gpu``; the device tree says it is not NVIDIA."""
    devices = tmp_path / "sys/devices/platform/ff9a0000.gpu"
    (devices / "devfreq/ff9a0000.gpu").mkdir(parents=True)
    (devices / "devfreq/ff9a0000.gpu/cur_freq").write_text("800000000\n")
    (devices / "of_node").mkdir()
    (devices / "of_node/name").write_text("gpu\0")
    (devices / "of_node/compatible").write_text("rockchip,rk3399-mali\0arm,mali-t860\0")
    (devices / "devfreq/ff9a0000.gpu/device").symlink_to("../../../ff9a0000.gpu")
    (tmp_path / "sys/class/devfreq").mkdir(parents=True)
    (tmp_path / "sys/class/devfreq/ff9a0000.gpu").symlink_to("../../devices/platform/ff9a0000.gpu/devfreq/ff9a0000.gpu")
    assert (tmp_path / "sys/class/devfreq/ff9a0000.gpu/device/of_node/name").exists()  # the tree is wired up
    backend = jetson.create(config_for(tmp_path))
    with pytest.raises(NoDevicesError):
        backend.open()


def test_gpu_node_without_compatible_counts_on_an_nvidia_board(tree):
    root = tree("orin-jp6")
    (root / "sys/firmware/devicetree/base/bus@0/gpu@17000000/compatible").unlink()
    shutil.rmtree(root / "sys/devices/soc0")  # only the device tree can vouch for the node here
    (root / "sys/firmware/devicetree/base/compatible").write_text("nvidia,p3768-0000+p3767-0000\0nvidia,tegra234\0")
    _, s = read_board(root)
    assert s.info["name"].endswith("(gpu)")
    assert s.values[("utilization", ())] == pytest.approx(0.447)
