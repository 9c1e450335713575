"""--gpu-vendor=auto on mixed nodes: every vendor found runs, and one log line says what was found."""

from __future__ import annotations

import logging
import os
import sys

import pynvml
import pytest

from gpu_exporter.backends import base
from gpu_exporter.backends.base import BackendError
from gpu_exporter.config import Config
from tests.fakes.fake_amdsmi import FakeAmdSmi, mi210, mi300x
from tests.support import child_env, paths, promtool_check

ROOT = paths.ROOT
ORIN = ROOT / "tests" / "fixtures" / "jetson" / "orin-jp6"


def no_nvidia_driver(monkeypatch):
    """NVML as on a machine without the NVIDIA driver, whatever this machine has."""

    def missing():
        raise pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(pynvml, "nvmlInit", missing)


def orin_config(vendor: str = "auto") -> Config:
    return Config(gpu_vendor=vendor, path_sysfs=str(ORIN / "sys"), path_procfs=str(ORIN / "proc"))


def test_mixed_amd_and_jetson_node_runs_both_and_logs_it(monkeypatch, caplog):
    no_nvidia_driver(monkeypatch)
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([mi300x(0), mi210(1)]))
    with caplog.at_level(logging.INFO, logger="gpu_exporter.backends.base"):
        backends = base.create(orin_config())
    try:
        assert [b.name for b in backends] == ["amd", "jetson"]
        readings = [s for b in backends for s in b.read()]
        assert [(s.info["vendor"], s.device.gpu) for s in readings] == [("amd", "0"), ("amd", "1"), ("nvidia", "0")]
        [line] = [r.getMessage() for r in caplog.records if "auto-detect: using" in r.getMessage()]
        assert line.startswith("auto-detect: using amd, jetson (not found: nvidia: NVIDIA library")
    finally:
        for b in backends:
            b.close()


def test_nothing_found_names_every_vendor_and_the_fake_way_out(monkeypatch, tmp_path):
    no_nvidia_driver(monkeypatch)
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # package not installed
    (tmp_path / "class/devfreq").mkdir(parents=True)
    with pytest.raises(BackendError) as info:
        base.create(Config(gpu_vendor="auto", path_sysfs=str(tmp_path)))
    message = str(info.value)
    assert "\n" not in message
    for part in (
        "nvidia: NVIDIA library",
        "amd: Python package amdsmi is not installed",
        "jetson: no Jetson GPU",
        "--gpu-vendor=fake",
    ):
        assert part in message


def test_a_vendor_library_failing_oddly_does_not_stop_the_others(monkeypatch):
    class Broken(FakeAmdSmi):
        def amdsmi_get_processor_handles(self):
            raise RuntimeError("segfault-adjacent")

    no_nvidia_driver(monkeypatch)
    monkeypatch.setitem(sys.modules, "amdsmi", Broken([mi300x()]))
    backends = base.create(orin_config())
    assert [b.name for b in backends] == ["jetson"]


def test_explicit_vendor_opens_only_that_backend(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", FakeAmdSmi([mi210()]))
    [backend] = base.create(orin_config("jetson"))
    assert backend.name == "jetson"
    [backend] = base.create(orin_config("amd"))
    assert backend.name == "amd"


# -- the CLI, as a real process --------------------------------------------------------------------

SHIM = """\
import sys
sys.path.insert(0, {root!r})
from tests.fakes.fake_amdsmi import FakeAmdSmi, mi300x

_fake = FakeAmdSmi([mi300x(0)])


def __getattr__(name):
    return getattr(_fake, name)
"""


def test_cli_auto_serves_amd_and_jetson_on_one_page(tmp_path, exporter):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "amdsmi.py").write_text(SHIM.format(root=str(ROOT)))
    env = child_env(PYTHONPATH=os.pathsep.join([str(shim), str(ROOT / "src")]))
    proc = exporter(
        "--gpu-vendor=auto",
        f"--path.sysfs={ORIN / 'sys'}",
        f"--path.procfs={ORIN / 'proc'}",
        "--gpu-metrics-collection-interval=200ms",
        env=env,
    ).start()
    page = proc.scrape()
    assert proc.stop() == 0
    log_text = proc.output()
    assert 'name="AMD Instinct MI300X"' in page, log_text
    assert "gpu_board_input_power_watts" in page
    assert 'memory="shared"' in page
    assert 'gpu_exporter_backend_healthy{backend="amd"} 1.0' in page
    assert 'gpu_exporter_backend_healthy{backend="jetson"} 1.0' in page
    assert "auto-detect: using " in log_text and "amd, jetson" in log_text
    promtool_check(page)
