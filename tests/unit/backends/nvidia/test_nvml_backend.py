"""The NVML backend against the simulated library, which raises pynvml's real error classes."""

from __future__ import annotations

import itertools
import logging
import time

import pynvml
import pytest

from gpu_exporter.backends.base import BackendError, NoDevicesError
from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import CRITICAL_XIDS, NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.model import DeviceSample


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make(
    gpus: int = 2, mig: int = 0, config: Config | None = None, missing: tuple[str, ...] = (), **kw: object
) -> tuple[SimNvml, NvmlBackend, Clock]:
    """Simulated GPUs (without the library functions in ``missing``) behind an opened backend."""
    clock = Clock()
    sim = SimNvml(gpus=gpus, mig=mig, clock=clock)
    sim.missing.update(missing)
    kw.setdefault("xid_wait_ms", 20)
    backend = NvmlBackend(config or Config(), nvml=sim, clock=clock, **kw)  # type: ignore[arg-type]
    backend.open()
    return sim, backend, clock


def by_uuid(samples: list[DeviceSample]) -> dict[str, DeviceSample]:
    return {s.device.uuid: s for s in samples}


def gpu(samples: list[DeviceSample], index: int) -> DeviceSample:
    return next(s for s in samples if s.device.gpu == str(index) and not s.device.is_mig)


def test_values_are_converted_to_base_units() -> None:
    sim, backend, clock = make()
    try:
        clock.now += 10  # counters such as NVLink bytes have moved on since the simulator started
        sample = gpu(backend.read(), 1)
        h = sim.nvmlDeviceGetHandleByIndex(1)
        assert sample.up
        assert sample.values[("power", ())] == pytest.approx(sim.nvmlDeviceGetPowerUsage(h) / 1000)  # mW -> W
        assert sample.values[("power_limit", ())] == 700.0
        assert sample.values[("energy", ())] == pytest.approx(sim.nvmlDeviceGetTotalEnergyConsumption(h) / 1000)
        assert sample.values[("utilization", ())] == pytest.approx(sim.nvmlDeviceGetUtilizationRates(h).gpu / 100)
        assert sample.values[("clock_sm", ())] == sim.nvmlDeviceGetClockInfo(h, 1) * 1_000_000  # MHz -> Hz
        assert sample.values[("clock_max_memory", ())] == 2619 * 1_000_000
        mem = sim.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert sample.values[("memory_used", ())] == mem.used
        assert sample.values[("memory_reserved", ())] == mem.reserved
        assert sample.values[("pcie_tx", ())] == sim.nvmlDeviceGetPcieThroughput(h, 0) * 1024  # KiB/s -> B/s
        assert sample.values[("nvlink_tx", ("17",))] > 0  # 18 links through field values
        assert ("nvlink_tx", ("18",)) not in sample.values
        assert sample.values[("ecc_corrected_aggregate", ())] == 3
        assert sample.values[("remapped_rows_correctable", ())] == 1
        assert sample.info["name"] == "NVIDIA H100 80GB HBM3"
        assert sample.info["pci_bus_id"] == "00000000:28:00.0"
        assert sample.info["device"] == "nvidia1"
        assert sample.info["cuda_version"] == "12.4"
        assert [p.pid for p in sample.processes] == [4010]
    finally:
        backend.close()


def test_not_supported_is_absent_and_not_asked_again() -> None:
    sim, backend, _ = make()
    try:
        backend.read()
        calls = sim.calls["nvmlDeviceGetFanSpeed"]
        for _ in range(3):
            samples = backend.read()
        assert all(("fan_speed", ()) not in s.values for s in samples)  # no 0, no NaN: absent
        assert sim.calls["nvmlDeviceGetFanSpeed"] == calls
        assert ("retired_pages_sbe", ()) not in gpu(samples, 0).values
        assert backend.errors["nvmlDeviceGetFanSpeed"] == 0  # unsupported is not an error
    finally:
        backend.close()


def test_function_not_found_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    _, backend, _ = make(missing=("nvmlDeviceGetCurrentClocksEventReasons",))
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(4):
                samples = backend.read()
        lines = [r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.getMessage()]
        assert len(lines) == 1
        assert not any(k == "clock_event_reason" for s in samples for (k, _) in s.values)
        assert gpu(samples, 0).values[("clock_sm", ())] > 0  # the rest of the cycle goes on
    finally:
        backend.close()


def test_memory_info_falls_back_to_v1_on_old_drivers() -> None:
    clock = Clock()
    sim = SimNvml(gpus=1, clock=clock)
    real = sim.nvmlDeviceGetMemoryInfo

    def old_driver(h: object, version: int | None = None) -> object:
        if version is not None:
            raise pynvml.NVMLError_FunctionNotFound()
        return real(h)  # type: ignore[arg-type]

    sim.nvmlDeviceGetMemoryInfo = old_driver  # type: ignore[method-assign]
    backend = NvmlBackend(Config(), nvml=sim, clock=clock, xid_wait_ms=20)
    backend.open()
    try:
        values = gpu(backend.read(), 0).values
        assert values[("memory_total", ())] == 80 * 1024**3
        assert ("memory_reserved", ()) not in values
    finally:
        backend.close()


def test_failed_call_is_counted_and_the_rest_is_read() -> None:
    sim, backend, _ = make()
    try:
        sim.fail(0, "nvmlDeviceGetPowerUsage", pynvml.NVMLError_Unknown)
        samples = backend.read()
        samples = backend.read()
        assert ("power", ()) not in gpu(samples, 0).values
        assert ("power", ()) in gpu(samples, 1).values
        assert gpu(samples, 0).up
        assert backend.errors["nvmlDeviceGetPowerUsage"] == 2  # counted each cycle, asked again each cycle
    finally:
        backend.close()


def test_gpu_lost_mid_run_then_back() -> None:
    sim, backend, clock = make(gpus=3, retry_initial=5.0)
    try:
        assert all(s.up for s in backend.read())
        sim.lose(1)
        samples = backend.read()
        assert not gpu(samples, 1).up
        assert gpu(samples, 1).values == {}
        assert gpu(samples, 0).up and gpu(samples, 2).up  # the others go on
        assert backend.healthy()
        # while backing off, the lost GPU is not asked at all (asking it fails, counted), the others are
        errors, calls = dict(backend.errors), sim.calls.total()
        clock.now += 1
        samples = backend.read()
        assert backend.errors == errors
        assert sim.calls.total() > calls
        assert gpu(samples, 0).up and gpu(samples, 2).up and not gpu(samples, 1).up
        sim.recover(1)
        clock.now += 1
        assert not gpu(backend.read(), 1).up  # still inside the 5 s backoff
        clock.now += 5
        samples = backend.read()
        assert gpu(samples, 1).up
        assert gpu(samples, 1).values[("memory_total", ())] > 0
    finally:
        backend.close()


def test_lost_gpu_backoff_grows() -> None:
    sim, backend, clock = make(gpus=1, retry_initial=2.0)
    try:
        sim.lose(0)
        backend.read()
        attempts = []
        for _ in range(40):
            clock.now += 1
            before = sim.calls["nvmlDeviceGetHandleByIndex"]
            backend.read()
            attempts.append(sim.calls["nvmlDeviceGetHandleByIndex"] > before)
        retry_times = [i for i, tried in enumerate(attempts) if tried]
        gaps = [b - a for a, b in itertools.pairwise(retry_times)]
        assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # 2, 4, 8, 16 ...
        assert not backend.healthy()
    finally:
        backend.close()


def test_mig_instances_get_their_own_series() -> None:
    _sim, backend, _ = make(gpus=2, mig=3)
    try:
        samples = backend.read()
        migs = [s for s in samples if s.device.is_mig]
        assert len(migs) == 3
        parent = gpu(samples, 0)
        for mig in migs:
            assert mig.device.parent_uuid == parent.device.uuid
            assert mig.device.mig_profile == "1g.10gb"
            assert mig.device.gpu == "0"
            assert mig.values[("memory_total", ())] == 10 * 1024**3
            assert mig.values[("processes", ())] == 1
            assert ("utilization", ()) not in mig.values  # NVML does not report it per instance
        assert sorted(m.device.gpu_instance for m in migs) == ["7", "8", "9"]
        assert len({m.device.uuid for m in migs}) == 3
        assert ("utilization", ()) not in parent.values  # not supported on a GPU in MIG mode
        assert ("utilization", ()) in gpu(samples, 1).values
    finally:
        backend.close()


def test_xid_events_are_counted_per_gpu_and_code() -> None:
    sim, backend, _ = make()
    try:
        values = gpu(backend.read(), 1).values
        assert all(values[("xid_errors", (str(x),))] == 0 for x in CRITICAL_XIDS)  # exist from the start
        sim.xid(1, 79)
        sim.xid(1, 79)
        sim.xid(1, 13)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            values = gpu(backend.read(), 1).values
            if values.get(("xid_errors", ("13",))) == 1:
                break
            time.sleep(0.02)
        assert values[("xid_errors", ("79",))] == 2
        assert values[("xid_errors", ("13",))] == 1
        assert gpu(backend.read(), 0).values[("xid_errors", ("79",))] == 0
    finally:
        backend.close()


def test_gpm_needs_two_samples() -> None:
    _sim, backend, clock = make()
    try:
        first = gpu(backend.read(), 0).values
        assert ("sm_active", ()) not in first
        clock.now += 1
        second = gpu(backend.read(), 0).values
        for key in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp16_active"):
            assert 0.0 <= second[(key, ())] <= 1.0
    finally:
        backend.close()


def test_disabled_collector_makes_no_calls() -> None:
    config = Config(disabled_collectors=frozenset({"pcie", "gpm", "xid"}))
    sim, backend, _ = make(config=config)
    try:
        values = gpu(backend.read(), 0).values
        assert sim.calls["nvmlDeviceGetPcieThroughput"] == 0
        assert sim.calls["nvmlGpmSampleGet"] == 0
        assert sim.calls["nvmlEventSetCreate"] == 0
        assert not any(k.startswith("pcie") for k, _ in values)
        assert ("power", ()) in values
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (pynvml.NVMLError_LibRmVersionMismatch, "version mismatch"),
        (pynvml.NVMLError_DriverNotLoaded, "driver is not loaded"),
        (pynvml.NVMLError_NoPermission, "permission"),
    ],
)
def test_init_errors_are_one_actionable_line(error: type[Exception], expected: str) -> None:
    sim = SimNvml(gpus=1)
    sim.init_error = error
    with pytest.raises(BackendError) as info:
        NvmlBackend(Config(), nvml=sim).open()
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_driver_library_with_the_real_pynvml() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:  # pragma: no cover - a machine with a driver
        pynvml.nvmlShutdown()
        pytest.skip("not applicable here: this machine has libnvidia-ml.so.1")
    with pytest.raises(BackendError) as info:
        NvmlBackend(Config()).open()
    assert "libnvidia-ml.so.1 not found" in str(info.value)
    assert "NVIDIA runtime" in str(info.value)


def test_no_devices() -> None:
    with pytest.raises(NoDevicesError):
        NvmlBackend(Config(), nvml=SimNvml(gpus=0)).open()


def test_gpu_lost_at_start_is_reported_down_not_fatal() -> None:
    clock = Clock()
    sim = SimNvml(gpus=2, clock=clock)
    sim.lose(1)
    backend = NvmlBackend(Config(), nvml=sim, clock=clock, xid_wait_ms=20)
    backend.open()
    try:
        samples = backend.read()
        assert gpu(samples, 0).up
        assert [s.up for s in samples if s.device.gpu == "1"] == [False]
    finally:
        backend.close()


def test_driver_without_the_v3_process_list_still_reads_every_value_and_its_processes() -> None:
    """pynvml's unversioned process call raises NVMLLibraryMismatchError (no NVMLError) before R510."""
    _, backend, _ = make(missing=("nvmlDeviceGetComputeRunningProcesses_v3",))
    try:
        for _ in range(2):
            samples = backend.read()
        sample = gpu(samples, 0)
        assert sample.up and ("power", ()) in sample.values
        assert sample.values[("processes", ())] == 1.0
        assert [p.pid for p in sample.processes] == [4000]
    finally:
        backend.close()
