"""A stand-in for the ``amdsmi`` package at the library boundary, backed by recorded card data.

Names, enum values, exception classes and the shape of every returned dict mirror amdsmi 7.0.2
(``amdsmi/amdsmi_interface.py`` and ``amdsmi_exception.py``): unsupported calls raise
``AmdSmiLibraryException`` with ``AMDSMI_STATUS_NOT_SUPPORTED``, fields the firmware does not fill come
back as ``"N/A"`` or as the raw max-int sentinel, exactly where the real wrapper does one or the other.

``FakeAmdSmi(cards)`` behaves like the imported module; ``mi300x()`` and ``mi210()`` build two
typical cards. ``card.fail[call] = status`` makes a call fail, ``card.lost = True`` makes the card
vanish (every call answers AMDSMI_STATUS_NOT_FOUND), and ``fake.calls`` counts calls by name.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_FILE_ERROR = 14
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34

UINT16_MAX = 0xFFFF
UINT32_MAX = 0xFFFFFFFF
UINT64_MAX = 0xFFFFFFFFFFFFFFFF


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(9)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(8)


class AmdSmiParameterException(AmdSmiException):
    def __init__(self, received: Any, expected: Any, msg: str | None = None) -> None:
        super().__init__(msg)
        self.err_code = None


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    DF = 1
    DCEF = 2
    SOC = 3
    MEM = 4


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiGpuBlock(IntEnum):
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


@dataclass
class FakeCard:
    """Recorded answers of one card; None for a call the card does not support (NOT_SUPPORTED)."""

    uuid: str
    bdf: str
    asic: dict[str, Any]
    driver: dict[str, Any]
    vbios: dict[str, Any]
    activity: dict[str, Any] | None
    vram_total: int | None
    vram_used: int | None
    temps: dict[AmdSmiTemperatureType, int]  # sensors that exist; others are NOT_SUPPORTED
    power: dict[str, Any] | None
    power_cap: dict[str, Any] | None
    energy: dict[str, Any] | None
    clocks: dict[AmdSmiClkType, dict[str, Any]]
    fan: tuple[int, int] | None  # (speed, max)
    pcie: dict[str, Any] | None
    ecc_total: dict[str, int] | None
    ecc_blocks: dict[AmdSmiGpuBlock, dict[str, int]]
    processes: list[dict[str, Any]] = field(default_factory=list)
    violation: dict[str, Any] | None = None  # amdsmi_get_violation_status (MI300 and newer)
    fail: dict[str, int] = field(default_factory=dict)  # call -> status code to raise
    lost: bool = False


def _clock(clk: int, max_clk: int, min_clk: int = 500) -> dict[str, Any]:
    return {"clk": clk, "min_clk": min_clk, "max_clk": max_clk, "clk_locked": False, "clk_deep_sleep": 0}


def _pcie(width: int, speed: int, bandwidth: Any, replay: Any) -> dict[str, Any]:
    return {
        "pcie_static": {
            "max_pcie_width": 16,
            "max_pcie_speed": 32000,
            "pcie_interface_version": 5,
            "slot_type": "OAM",
        },
        "pcie_metric": {
            "pcie_width": width,
            "pcie_speed": speed,
            "pcie_bandwidth": bandwidth,
            "pcie_replay_count": replay,
            "pcie_l0_to_recovery_count": 0,
            "pcie_replay_roll_over_count": 0,
            "pcie_nak_sent_count": 0,
            "pcie_nak_received_count": 0,
            "pcie_lc_perf_other_end_recovery_count": 0,
        },
    }


def _process(pid: int, vram: int) -> dict[str, Any]:
    return {
        "name": "python3",
        "pid": pid,
        "mem": vram,
        "engine_usage": {"gfx": 1000, "enc": 0},
        "memory_usage": {"gtt_mem": 2 * 1024 * 1024, "cpu_mem": 0, "vram_mem": vram},
        "cu_occupancy": "N/A",
    }


def violation_status(samples: int, ppt: int, socket_thermal: int) -> dict[str, Any]:
    """``amdsmi_get_violation_status``'s dict: accumulated firmware samples, and those held down by the
    power (PVIOL) and socket thermal (TVIOL) limits; sensors the firmware lacks are "N/A"."""
    per_xcp = [["N/A"] * 8 for _ in range(8)]
    return {
        "reference_timestamp": 1_717_000_000_000_000,
        "violation_timestamp": 1_000,
        "acc_counter": samples,
        "acc_prochot_thrm": 0,
        "acc_ppt_pwr": ppt,
        "acc_socket_thrm": socket_thermal,
        "acc_vr_thrm": 0,
        "acc_hbm_thrm": 0,
        "acc_gfx_clk_below_host_limit": "N/A",
        "acc_gfx_clk_below_host_limit_pwr": copy.deepcopy(per_xcp),
        "acc_gfx_clk_below_host_limit_thm": copy.deepcopy(per_xcp),
        "acc_gfx_clk_below_host_limit_total": copy.deepcopy(per_xcp),
        "acc_low_utilization": copy.deepcopy(per_xcp),
        "per_prochot_thrm": 0,
        "per_ppt_pwr": 100 * ppt // samples if samples else 0,
        "per_socket_thrm": 100 * socket_thermal // samples if samples else 0,
        "per_vr_thrm": 0,
        "per_hbm_thrm": 0,
        "per_gfx_clk_below_host_limit": "N/A",
        "per_gfx_clk_below_host_limit_pwr": copy.deepcopy(per_xcp),
        "per_gfx_clk_below_host_limit_thm": copy.deepcopy(per_xcp),
        "per_gfx_clk_below_host_limit_total": copy.deepcopy(per_xcp),
        "per_low_utilization": copy.deepcopy(per_xcp),
        "active_prochot_thrm": False,
        "active_ppt_pwr": ppt > 0,
        "active_socket_thrm": False,
        "active_vr_thrm": False,
        "active_hbm_thrm": False,
        "active_gfx_clk_below_host_limit": "N/A",
        "active_gfx_clk_below_host_limit_pwr": copy.deepcopy(per_xcp),
        "active_gfx_clk_below_host_limit_thm": copy.deepcopy(per_xcp),
        "active_gfx_clk_below_host_limit_total": copy.deepcopy(per_xcp),
        "active_low_utilization": copy.deepcopy(per_xcp),
    }


def mi300x(index: int = 0) -> FakeCard:
    """MI300X-style: instantaneous socket power, no edge sensor, hotspot and HBM stacks, no fan."""
    return FakeCard(
        uuid=f"7fff74a1-0000-1000-80a6-5e0b7c3a2e{index:02d}",
        bdf=f"0000:{0x0C + index:02x}:00.0",
        asic={
            "market_name": "AMD Instinct MI300X",
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x46D5C4F1A2B3C{index:03X}",
            "oam_id": index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
            "subsystem_id": "0x74a1",
        },
        driver={"driver_name": "amdgpu", "driver_version": "6.8.5", "driver_date": "2015/01/01 00:00"},
        vbios={
            "name": "AMD MI300X_HW_SRIOV_CVS_1VF",
            "build_date": "2024/05/10 13:38",
            "part_number": "113-M3000100-102",
            "version": "022.040.003.043.000001",
        },
        activity={"gfx_activity": 87, "umc_activity": 41, "mm_activity": "N/A"},
        vram_total=206141652992,
        vram_used=12884901888,
        temps={
            AmdSmiTemperatureType.HOTSPOT: 71,
            AmdSmiTemperatureType.HBM_0: 55,
            AmdSmiTemperatureType.HBM_1: 58,
            AmdSmiTemperatureType.HBM_2: 56,
            AmdSmiTemperatureType.HBM_3: 54,
        },
        power={
            "socket_power": 512,
            "current_socket_power": 512,
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": 750,
        },
        power_cap={
            "power_cap": 750_000_000,
            "default_power_cap": 750_000_000,
            "dpm_cap": 0,
            "min_power_cap": 0,
            "max_power_cap": 750_000_000,
        },
        energy={"energy_accumulator": 123_456_789_012, "counter_resolution": 15.259, "timestamp": 1},
        clocks={
            AmdSmiClkType.GFX: _clock(2100, 2100),
            AmdSmiClkType.MEM: _clock(1300, 1300, 900),
            AmdSmiClkType.SOC: _clock(1143, 1524, 28),
        },
        fan=None,
        pcie=_pcie(16, 32000, 32768, 3),
        ecc_total={"correctable_count": 12, "uncorrectable_count": 0, "deferred_count": 0},
        ecc_blocks={
            AmdSmiGpuBlock.UMC: {"correctable_count": 12, "uncorrectable_count": 0, "deferred_count": 0},
            AmdSmiGpuBlock.GFX: {"correctable_count": 0, "uncorrectable_count": 0, "deferred_count": 0},
        },
        processes=[_process(4242, 8 * 1024**3), _process(4343, 4 * 1024**3)],
        violation=violation_status(1_000_000, 20_000, 0),
    )


def mi210(index: int = 1) -> FakeCard:
    """MI210-style: averaged socket power, edge and junction and memory sensors, sentinels elsewhere."""
    return FakeCard(
        uuid=f"a8ff740f-0000-1000-8080-9a1b2c3d4e{index:02d}",
        bdf=f"0000:{0x83 + index:02x}:00.0",
        asic={
            "market_name": "AMD Instinct MI210",
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "subvendor_id": "0x1002",
            "device_id": "0x740f",
            "rev_id": "0x02",
            "asic_serial": "N/A",
            "oam_id": "N/A",
            "num_compute_units": 104,
            "target_graphics_version": "gfx90a",
            "subsystem_id": "0x0c34",
        },
        driver={"driver_name": "amdgpu", "driver_version": "6.3.6", "driver_date": "2015/01/01 00:00"},
        vbios={"name": "N/A", "build_date": "N/A", "part_number": "113-D67301-063", "version": "N/A"},
        activity={"gfx_activity": 12, "umc_activity": 3, "mm_activity": UINT32_MAX},  # passed through raw
        vram_total=68702699520,
        vram_used=1073741824,
        temps={
            AmdSmiTemperatureType.EDGE: 44,
            AmdSmiTemperatureType.HOTSPOT: 49,
            AmdSmiTemperatureType.VRAM: 61,
        },
        power={
            "socket_power": 97,
            "current_socket_power": "N/A",
            "average_socket_power": 97,
            "gfx_voltage": 831,
            "soc_voltage": 806,
            "mem_voltage": 1250,
            "power_limit": 300,
        },
        power_cap={
            "power_cap": 300_000_000,
            "default_power_cap": 300_000_000,
            "dpm_cap": 1700,
            "min_power_cap": 0,
            "max_power_cap": 300_000_000,
        },
        energy={"energy_accumulator": 65536, "counter_resolution": 15.259, "timestamp": 1},
        clocks={
            AmdSmiClkType.GFX: _clock(800, 1700),
            AmdSmiClkType.MEM: _clock(1600, 1600),
            AmdSmiClkType.SOC: _clock("N/A", "N/A"),
        },
        fan=(64, 255),
        pcie=_pcie(16, 16000, "N/A", "N/A"),
        ecc_total={"correctable_count": 0, "uncorrectable_count": 1, "deferred_count": 0},
        ecc_blocks={AmdSmiGpuBlock.UMC: {"correctable_count": 0, "uncorrectable_count": 1, "deferred_count": 0}},
        processes=[],
    )


class _Handle:
    """Opaque like the library's ctypes handle: only the fake looks inside."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class FakeAmdSmi:
    """Module-like: ``backend = AmdBackend(config, smi=FakeAmdSmi([mi300x(), mi210()]))``."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiClkType = AmdSmiClkType
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiGpuBlock = AmdSmiGpuBlock
    AmdSmiMemoryType = AmdSmiMemoryType

    def __init__(self, cards: list[FakeCard], init_status: int = 0) -> None:
        self.cards = [copy.deepcopy(c) for c in cards]
        self.init_status = init_status
        self.initialised = False
        self.calls: Counter[str] = Counter()

    # library state
    def amdsmi_init(self, flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        self.calls["amdsmi_init"] += 1
        if not isinstance(flag, AmdSmiInitFlags):
            raise AmdSmiParameterException(flag, AmdSmiInitFlags)
        if self.init_status:
            raise AmdSmiLibraryException(self.init_status)
        self.initialised = True

    def amdsmi_shut_down(self) -> None:
        self.calls["amdsmi_shut_down"] += 1
        self.initialised = False

    def amdsmi_get_processor_handles(self) -> list[_Handle]:
        self.calls["amdsmi_get_processor_handles"] += 1
        self._require_init()
        return [_Handle(i) for i in range(len(self.cards))]

    def _require_init(self) -> None:
        if not self.initialised:
            raise AmdSmiLibraryException(32)  # AMDSMI_STATUS_NOT_INIT

    def _card(self, call: str, handle: Any) -> FakeCard:
        self.calls[call] += 1
        self._require_init()
        if not isinstance(handle, _Handle):
            raise AmdSmiParameterException(handle, _Handle)
        card = self.cards[handle.index]
        if card.lost:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_FOUND)
        if call in card.fail:
            raise AmdSmiLibraryException(card.fail[call])
        return card

    @staticmethod
    def _supported(value: Any) -> Any:
        if value is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return copy.deepcopy(value)

    # identity
    def amdsmi_get_gpu_device_uuid(self, h: Any) -> str:
        return self._card("amdsmi_get_gpu_device_uuid", h).uuid

    def amdsmi_get_gpu_device_bdf(self, h: Any) -> str:
        return self._card("amdsmi_get_gpu_device_bdf", h).bdf

    def amdsmi_get_gpu_asic_info(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_gpu_asic_info", h).asic)

    def amdsmi_get_gpu_driver_info(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_gpu_driver_info", h).driver)

    def amdsmi_get_gpu_vbios_info(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_gpu_vbios_info", h).vbios)

    # readings
    def amdsmi_get_gpu_activity(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_gpu_activity", h).activity)

    def amdsmi_get_gpu_memory_total(self, h: Any, mem_type: AmdSmiMemoryType) -> int:
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        return self._supported(self._card("amdsmi_get_gpu_memory_total", h).vram_total)

    def amdsmi_get_gpu_memory_usage(self, h: Any, mem_type: AmdSmiMemoryType) -> int:
        if not isinstance(mem_type, AmdSmiMemoryType):
            raise AmdSmiParameterException(mem_type, AmdSmiMemoryType)
        return self._supported(self._card("amdsmi_get_gpu_memory_usage", h).vram_used)

    def amdsmi_get_gpu_vram_usage(self, h: Any) -> dict[str, int]:
        card = self._card("amdsmi_get_gpu_vram_usage", h)
        total, used = self._supported(card.vram_total), self._supported(card.vram_used)
        return {"vram_total": total // (1024 * 1024), "vram_used": used // (1024 * 1024)}

    def amdsmi_get_temp_metric(self, h: Any, sensor: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
        if not isinstance(sensor, AmdSmiTemperatureType):
            raise AmdSmiParameterException(sensor, AmdSmiTemperatureType)
        if not isinstance(metric, AmdSmiTemperatureMetric):
            raise AmdSmiParameterException(metric, AmdSmiTemperatureMetric)
        return self._supported(self._card("amdsmi_get_temp_metric", h).temps.get(sensor))

    def amdsmi_get_power_info(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_power_info", h).power)

    def amdsmi_get_power_cap_info(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_power_cap_info", h).power_cap)

    def amdsmi_get_energy_count(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_energy_count", h).energy)

    def amdsmi_get_clock_info(self, h: Any, clock_type: AmdSmiClkType) -> dict[str, Any]:
        if not isinstance(clock_type, AmdSmiClkType):
            raise AmdSmiParameterException(clock_type, AmdSmiClkType)
        return self._supported(self._card("amdsmi_get_clock_info", h).clocks.get(clock_type))

    def amdsmi_get_gpu_fan_speed(self, h: Any, sensor_idx: int) -> int:
        fan = self._supported(self._card("amdsmi_get_gpu_fan_speed", h).fan)
        return int(fan[0])

    def amdsmi_get_gpu_fan_speed_max(self, h: Any, sensor_idx: int) -> int:
        fan = self._supported(self._card("amdsmi_get_gpu_fan_speed_max", h).fan)
        return int(fan[1])

    def amdsmi_get_pcie_info(self, h: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_pcie_info", h).pcie)

    def amdsmi_get_gpu_total_ecc_count(self, h: Any) -> dict[str, int]:
        return self._supported(self._card("amdsmi_get_gpu_total_ecc_count", h).ecc_total)

    def amdsmi_get_gpu_ecc_count(self, h: Any, block: AmdSmiGpuBlock) -> dict[str, int]:
        if not isinstance(block, AmdSmiGpuBlock):
            raise AmdSmiParameterException(block, AmdSmiGpuBlock)
        return self._supported(self._card("amdsmi_get_gpu_ecc_count", h).ecc_blocks.get(block))

    def amdsmi_get_gpu_process_list(self, h: Any) -> list[dict[str, Any]]:
        return self._supported(self._card("amdsmi_get_gpu_process_list", h).processes)

    def amdsmi_get_violation_status(self, processor_handle: Any) -> dict[str, Any]:
        return self._supported(self._card("amdsmi_get_violation_status", processor_handle).violation)
