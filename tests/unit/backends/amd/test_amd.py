"""The AMD backend against a fake ``amdsmi`` module (tests/fakes/fake_amdsmi.py)."""

from __future__ import annotations

import ctypes.util
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_exporter.backends.amd import backend as amd
from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.config import Config
from tests.fakes.fake_amdsmi import (
    AMDSMI_STATUS_DRIVER_NOT_LOADED,
    AMDSMI_STATUS_FILE_ERROR,
    FakeAmdSmi,
    mi210,
    mi300x,
)
from tests.support import paths

GiB = 1024**3


def opened(*cards, config=None, **kwargs):
    fake = FakeAmdSmi(list(cards))
    backend = amd.AmdBackend(config or Config(gpu_vendor="amd"), smi=fake, **kwargs)
    backend.open()
    return backend, fake


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def scalar(sample, key, labels=()):
    return sample.values.get((key, labels))


def open_amd_in_child(pythonpath: str, **env: str) -> list[str]:
    """The lines a fresh interpreter prints when it opens the AMD backend (``ERR <message>`` on failure)."""
    code = (
        "from gpu_exporter.backends.amd import backend as amd\n"
        "from gpu_exporter.backends.base import BackendError\n"
        "from gpu_exporter.config import Config\n"
        "try:\n"
        "    amd.create(Config()).open()\n"
        "except BackendError as e:\n"
        "    print('ERR', e)\n"
    )
    child_env = {"PYTHONPATH": pythonpath, "PATH": "/usr/bin:/bin", **env}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=60, check=True
    )
    return out.stdout.strip().splitlines()


def test_mi300_reads_current_power_junction_and_hottest_hbm_stack():
    backend, _ = opened(mi300x())
    [gpu] = backend.read()
    assert gpu.up
    assert gpu.device.gpu == "0"
    assert gpu.device.uuid == "7fff74a1-0000-1000-80a6-5e0b7c3a2e00"
    assert scalar(gpu, "power") == 512.0  # current_socket_power, average is N/A on MI300
    assert scalar(gpu, "power_limit") == 750.0  # power_cap is in microwatts
    assert scalar(gpu, "temp_junction") == 71.0
    assert scalar(gpu, "temp_memory") == 58.0  # the hottest of four HBM stacks
    assert scalar(gpu, "temp_gpu") is None  # no edge sensor on MI300: absent, not 0
    assert scalar(gpu, "utilization") == pytest.approx(0.87)
    assert scalar(gpu, "memory_utilization") == pytest.approx(0.41)
    assert scalar(gpu, "multimedia_utilization") is None  # "N/A"
    assert scalar(gpu, "memory_total") == 206141652992
    assert scalar(gpu, "memory_used") == 12 * GiB
    assert scalar(gpu, "memory_free") == 206141652992 - 12 * GiB
    assert scalar(gpu, "energy") == pytest.approx(123_456_789_012 * 15.259e-6)
    assert scalar(gpu, "clock_graphics") == 2100e6
    assert scalar(gpu, "clock_max_graphics") == 2100e6
    assert scalar(gpu, "clock_memory") == 1300e6
    assert scalar(gpu, "clock_soc") == 1143e6
    assert scalar(gpu, "clock_max_soc") == 1524e6
    assert scalar(gpu, "fan_speed") is None  # passively cooled: NOT_SUPPORTED
    assert scalar(gpu, "pcie_link_width") == 16
    assert scalar(gpu, "pcie_link_generation") == 5  # 32000 MT/s
    assert scalar(gpu, "pcie_bandwidth") == 32768 * 1e6 / 8
    assert scalar(gpu, "pcie_replay") == 3
    assert scalar(gpu, "ecc_corrected_volatile") == 12
    assert scalar(gpu, "ecc_uncorrected_volatile") == 0
    assert scalar(gpu, "ecc_block_corrected", ("umc",)) == 12
    assert scalar(gpu, "ecc_block_uncorrected", ("gfx",)) == 0
    assert ("ecc_block_corrected", ("sdma",)) not in gpu.values
    assert scalar(gpu, "processes") == 2
    assert scalar(gpu, "processes_memory") == 12 * GiB
    assert [(p.pid, p.memory_bytes) for p in gpu.processes] == [(4242, 8 * GiB), (4343, 4 * GiB)]
    assert gpu.info == {
        "vendor": "amd",
        "name": "AMD Instinct MI300X",
        "serial": "0x46D5C4F1A2B3C000",
        "pci_bus_id": "0000:0c:00.0",
        "driver_version": "6.8.5",
        "vbios_version": "022.040.003.043.000001",
    }
    assert backend.errors == {}  # unsupported is not an error
    assert backend.healthy()


def test_mi200_reads_average_power_edge_temperature_and_fan():
    backend, _ = opened(mi210())
    [gpu] = backend.read()
    assert scalar(gpu, "power") == 97.0  # average_socket_power, current is N/A
    assert scalar(gpu, "temp_gpu") == 44.0
    assert scalar(gpu, "temp_junction") == 49.0
    assert scalar(gpu, "temp_memory") == 61.0  # the VRAM sensor
    assert scalar(gpu, "fan_speed") == pytest.approx(64 / 255)
    assert scalar(gpu, "pcie_link_generation") == 4
    assert scalar(gpu, "multimedia_utilization") is None  # raw UINT32_MAX sentinel
    assert scalar(gpu, "pcie_bandwidth") is None  # "N/A"
    assert scalar(gpu, "pcie_replay") is None
    assert scalar(gpu, "clock_soc") is None and scalar(gpu, "clock_max_soc") is None
    assert scalar(gpu, "ecc_uncorrected_volatile") == 1
    assert scalar(gpu, "processes") == 0
    assert scalar(gpu, "processes_memory") == 0
    # "N/A" identity strings are left out of gpu_info rather than shown as "N/A"
    assert "serial" not in gpu.info and "vbios_version" not in gpu.info
    assert gpu.info["name"] == "AMD Instinct MI210"


def test_two_cards_are_numbered_in_library_order_with_their_own_uuids():
    backend, _ = opened(mi300x(0), mi210(1))
    samples = backend.read()
    assert [(s.device.gpu, s.info["name"]) for s in samples] == [
        ("0", "AMD Instinct MI300X"),
        ("1", "AMD Instinct MI210"),
    ]
    assert len({s.device.uuid for s in samples}) == 2


def test_unsupported_call_is_not_asked_again():
    backend, fake = opened(mi300x())
    backend.read()
    first = fake.calls["amdsmi_get_gpu_fan_speed"]
    backend.read()
    backend.read()
    assert first == 1
    assert fake.calls["amdsmi_get_gpu_fan_speed"] == 1
    assert fake.calls["amdsmi_get_gpu_activity"] == 3  # supported calls are asked every cycle


def test_failed_call_counts_an_error_and_keeps_the_rest():
    card = mi300x()
    card.fail["amdsmi_get_power_info"] = AMDSMI_STATUS_FILE_ERROR
    backend, fake = opened(card)
    [gpu] = backend.read()
    [gpu] = backend.read()
    assert gpu.up
    assert scalar(gpu, "power") is None
    assert scalar(gpu, "temp_junction") == 71.0
    assert backend.errors["amdsmi_get_power_info"] == 2  # a transient failure is retried and counted
    assert fake.calls["amdsmi_get_power_info"] == 2


def test_lost_card_is_down_retried_with_backoff_and_the_other_card_still_reads():
    clock = Clock()
    backend, fake = opened(mi300x(0), mi210(1), clock=clock, retry_initial=5.0)
    fake.cards[0].lost = True
    first, second = backend.read()
    assert not first.up and first.values == {}
    assert first.info["name"] == "AMD Instinct MI300X"  # still identifiable on the page
    assert first.device.uuid == "7fff74a1-0000-1000-80a6-5e0b7c3a2e00"
    assert second.up and scalar(second, "power") == 97.0
    assert backend.errors["amdsmi_get_gpu_activity"] == 1
    assert backend.healthy()  # one card still answers

    asked = fake.calls["amdsmi_get_gpu_activity"]
    clock.now += 4  # inside the 5 s backoff: the lost card is not asked at all
    first, _ = backend.read()
    assert not first.up
    assert fake.calls["amdsmi_get_gpu_activity"] == asked + 1  # only the healthy card

    fake.cards[0].lost = False
    clock.now += 2  # past the backoff: identity is re-read and the card is up again
    first, _ = backend.read()
    assert first.up and scalar(first, "power") == 512.0


def test_all_cards_lost_is_unhealthy():
    backend, fake = opened(mi300x(0), mi210(1))
    fake.cards[0].lost = fake.cards[1].lost = True
    assert [s.up for s in backend.read()] == [False, False]
    assert not backend.healthy()


def test_card_lost_at_start_is_listed_down_and_attached_later():
    clock = Clock()
    fake = FakeAmdSmi([mi300x(0)])
    fake.cards[0].lost = True
    backend = amd.AmdBackend(Config(), smi=fake, clock=clock, retry_initial=1.0)
    backend.open()
    [gpu] = backend.read()
    assert not gpu.up and gpu.device.gpu == "0"
    fake.cards[0].lost = False
    clock.now += 1.5
    [gpu] = backend.read()
    assert gpu.up and gpu.device.uuid == "7fff74a1-0000-1000-80a6-5e0b7c3a2e00"
    assert gpu.info["name"] == "AMD Instinct MI300X"


def test_disabled_collectors_are_not_asked():
    config = Config(disabled_collectors=frozenset({"processes", "ecc"}))
    backend, fake = opened(mi300x(), config=config)
    [gpu] = backend.read()
    assert fake.calls["amdsmi_get_gpu_process_list"] == 0
    assert fake.calls["amdsmi_get_gpu_total_ecc_count"] == 0
    assert scalar(gpu, "processes") is None and gpu.processes == ()
    assert scalar(gpu, "power") == 512.0


def test_garbage_process_entry_is_skipped_and_counted():
    card = mi300x()
    card.processes.append({"pid": "N/A", "memory_usage": {"vram_mem": 1}})
    backend, _ = opened(card)
    [gpu] = backend.read()
    assert scalar(gpu, "processes") == 2
    assert backend.errors["amdsmi_get_gpu_process_list"] == 1


def test_missing_function_in_older_package_is_logged_once(caplog):
    fake = FakeAmdSmi([mi300x()])
    del_name = "amdsmi_get_gpu_memory_total"

    class Older(FakeAmdSmi):
        def __getattribute__(self, name):
            if name == del_name:
                raise AttributeError(name)
            return super().__getattribute__(name)

    older = Older(fake.cards)
    backend = amd.create(Config(), smi=older)
    backend.open()
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.backends.amd"):
        backend.read()
        [gpu] = backend.read()
    assert sum(del_name in r.getMessage() for r in caplog.records) == 1
    # the MB-granular vram_usage call stands in
    assert scalar(gpu, "memory_total") == (206141652992 // (1024 * 1024)) * 1024 * 1024


def test_no_cards_is_no_devices_error():
    backend = amd.create(Config(), smi=FakeAmdSmi([]))
    with pytest.raises(NoDevicesError):
        backend.open()


def test_driver_not_loaded_is_one_actionable_line():
    backend = amd.create(Config(), smi=FakeAmdSmi([mi300x()], init_status=AMDSMI_STATUS_DRIVER_NOT_LOADED))
    with pytest.raises(BackendError, match="amdgpu kernel driver is not loaded") as info:
        backend.open()
    assert "\n" not in str(info.value)


def test_close_shuts_the_library_down():
    backend, fake = opened(mi300x())
    backend.close()
    assert fake.calls["amdsmi_shut_down"] == 1 and not fake.initialised
    assert not backend.healthy()


@pytest.mark.skipif(
    bool(ctypes.util.find_library("amd_smi")) or Path("/opt/rocm/lib/libamd_smi.so").exists(),
    reason="not applicable here: ROCm's libamd_smi.so is installed",
)
def test_real_package_without_rocm_library_gives_library_not_found(tmp_path):
    """The installed amdsmi raises KeyError at import when libamd_smi.so is missing (as here)."""
    lines = open_amd_in_child(str(paths.ROOT / "src"), ROCM_PATH=str(tmp_path))
    # the package's own two printed lines are swallowed: only our one line remains
    assert len(lines) == 1, lines
    assert lines[0].startswith("ERR AMD SMI library not found (libamd_smi.so)")
    assert "/dev/kfd" in lines[0]


def test_close_does_not_wait_for_a_call_that_hangs_in_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM's path: close() while the sampler is inside an AMD SMI call that does not return. It waits
    CLOSE_WAIT, then leaves the library as it is (shutting it down under a running call is unsafe)."""
    import threading

    monkeypatch.setattr(amd, "CLOSE_WAIT", 0.1)
    backend, fake = opened(mi300x(0))
    inside, release = threading.Event(), threading.Event()
    answer = fake.amdsmi_get_gpu_activity

    def hangs(handle: object) -> object:
        inside.set()
        release.wait(30)
        return answer(handle)

    monkeypatch.setattr(fake, "amdsmi_get_gpu_activity", hangs)
    reading = threading.Thread(target=backend.read, daemon=True)
    reading.start()
    try:
        assert inside.wait(10)
        backend.close()
        assert reading.is_alive(), "close() waited for the call to return"
        assert fake.calls["amdsmi_shut_down"] == 0
    finally:
        release.set()
        reading.join(10)
