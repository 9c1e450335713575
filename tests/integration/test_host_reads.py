"""The agent CLI on a hostile host, seen from outside: a Jetson tree (a copy of the Orin JetPack 6 one)
with one rail's file a FIFO, a FIFO whose writer never writes, or a file whose read blocks in the kernel
(FUSE standing in for a hung I2C bus); /proc/meminfo, nvmap's clients or a pod's cgroup as /dev/zero or
an endless file; and a sampler stuck in a vendor call that never returns.

Each must cost what that file holds and nothing more: the other values keep coming, /metrics answers,
/readyz tells the truth, memory stays bounded, and SIGTERM ends the agent (within the 15 s the helper
waits before it kills)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import nvml_lib
from tests.support import FIXTURES, child_env, exporter_cmd, free_port, http_get, stop_process, wait_until
from tests.support.agent_proc import Proc
from tests.support.fuse import HungFile, available

pytestmark = pytest.mark.integration

HWMON = "sys/devices/platform/bus@0/c240000.i2c/i2c-1/1-0040/hwmon/hwmon1"
FAST = "--gpu-metrics-collection-interval=200ms"
MiB = 1 << 20


@pytest.fixture
def board(tmp_path: Path) -> Path:
    root = tmp_path / "orin-jp6"
    shutil.copytree(FIXTURES / "jetson" / "orin-jp6", root, symlinks=True)
    return root


def jetson_args(root: Path) -> list[str]:
    return ["--gpu-vendor=jetson", f"--path.sysfs={root / 'sys'}", f"--path.procfs={root / 'proc'}", FAST]


def series(page: str) -> dict[str, float]:
    out = {}
    for line in page.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def collects(agent: Proc) -> float:
    return series(agent.scrape())["gpu_exporter_collects_total"]


def keeps_sampling(agent: Proc, cycles: int = 5) -> dict[str, float]:
    """The page once ``cycles`` more collect cycles have run: the sampler is not stuck."""
    start = collects(agent)
    wait_until(lambda: collects(agent) >= start + cycles, 20, f"{cycles} more collect cycles")
    return series(agent.scrape())


def peak_rss(agent: Proc) -> int:
    assert agent.proc is not None
    for line in Path(f"/proc/{agent.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def ready(agent: Proc) -> tuple[int, str]:
    status, body, _ = http_get(f"http://127.0.0.1:{agent.port}/readyz")
    return status, body.decode(errors="replace")


RAIL = 'gpu_power_rail_watts{gpu="0",uuid="jetson-1424623045678",rail="%s"}'


@pytest.fixture(params=["fifo", "fifo-with-a-silent-writer", "read-hangs-in-the-kernel"])
def broken_rail(request: pytest.FixtureRequest, board: Path) -> Iterator[HungFile | str]:
    """VDD_CPU_GPU_CV's current file made one that never answers: the HungFile, or the reason counted."""
    current = board / HWMON / "curr2_input"
    if request.param == "read-hangs-in-the-kernel":
        why = available()
        if why:
            pytest.skip(why)
        with HungFile(current) as hung:
            yield hung
        return
    current.unlink()
    os.mkfifo(current)
    writer = os.open(current, os.O_RDWR) if request.param == "fifo-with-a-silent-writer" else None
    try:
        yield "not_regular"
    finally:
        if writer is not None:
            os.close(writer)


def _stop_past_a_hung_read(agent: Proc, hung: HungFile) -> int:
    """SIGTERM, then the agent's own shutdown must finish ("stopped") while its read still hangs. The
    process itself cannot end before that read does: a thread waiting in the kernel without a timeout
    (a FUSE read sent to its server, a hung bus) keeps the process alive even through SIGKILL. So the
    hang is then ended, as a bus reset would, and the exit status is the agent's own."""
    assert agent.proc is not None
    agent.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "msg=stopped" in agent.log() or agent.proc.poll() is not None, 15, "the agent's shutdown")
    hung.stop()
    try:
        return agent.proc.wait(15)  # no second SIGTERM: it is on its way out
    except subprocess.TimeoutExpired:
        return agent.stop()


def test_a_rail_that_never_answers_costs_that_rail_alone(
    tmp_path: Path, board: Path, broken_rail: HungFile | str
) -> None:
    reason = "timeout" if isinstance(broken_rail, HungFile) else broken_rail
    agent = Proc(tmp_path, *jetson_args(board), name="jetson").start()
    code = None
    try:
        page = keeps_sampling(agent)
        assert RAIL % "VDD_CPU_GPU_CV" not in page
        assert page[RAIL % "VDD_IN"] == pytest.approx(13.895616)
        assert page[RAIL % "VDD_SOC"] == pytest.approx(2.754816)
        assert 'gpu_utilization_ratio{gpu="0",uuid="jetson-1424623045678"}' in page
        assert page[f'gpu_exporter_host_read_failures_total{{reason="{reason}"}}'] >= 1
        assert page['gpu_exporter_collect_errors_total{backend="jetson",call="rail"}'] >= 5
        if isinstance(broken_rail, HungFile):  # one wait, then skipped while the read hangs
            assert broken_rail.reads == 1
            assert page['gpu_exporter_host_read_failures_total{reason="stuck"}'] >= 4
            assert page["gpu_exporter_host_reads_stuck"] >= 1
        assert page["gpu_exporter_sampler_stale"] == 0
        assert ready(agent)[0] == 200
        if isinstance(broken_rail, HungFile):
            code = _stop_past_a_hung_read(agent, broken_rail)
    finally:
        code = agent.stop() if code is None else code
    assert code == 0, agent.log()[-3000:]


def _endless(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(64 << 30)  # 64 GiB of NULs, sparse: one line that never ends


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


CASES = {
    "meminfo-dev-zero": ("proc/meminfo", _dev_zero),
    "meminfo-endless": ("proc/meminfo", _endless),
    "nvmap-clients-dev-zero": ("sys/kernel/debug/nvmap/iovmm/clients", _dev_zero),
    "pod-cgroup-dev-zero": ("proc/2101/cgroup", _dev_zero),  # deepstream, of the pod video_analytics-0
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_file_that_never_ends_costs_bounded_memory_and_its_values_alone(
    tmp_path: Path, board: Path, case: str
) -> None:
    where, make = CASES[case]
    (board / where).unlink()
    make(board / where)
    pods = [
        "--k8s.pod-attribution=true",
        f"--k8s.pod-logs-path={board / 'var' / 'log' / 'pods'}",
        f"--k8s.kubelet-socket={board / 'no-kubelet.sock'}",  # KubeEdge: EdgeCore makes none
    ]
    agent = Proc(tmp_path, *jetson_args(board), *pods, name="jetson").start()
    try:
        page = keeps_sampling(agent)
        assert ready(agent)[0] == 200  # the GPU answers: ready is the truth
        assert 'gpu_utilization_ratio{gpu="0",uuid="jetson-1424623045678"}' in page
        if where == "proc/meminfo":
            assert not any(name.startswith("gpu_memory_total_bytes") for name in page)

        # the pod attribution thread names the pods of the processes it can read
        def pods_named() -> str:
            text = agent.scrape()
            return text if 'pod="tracker-5d8f9"' in text else ""

        text = wait_until(pods_named, 20, "the pod series")
        if case == "pod-cgroup-dev-zero":  # deepstream's pod is not known; the other pod's processes are
            assert 'pod="analytics-0"' not in text
        assert sum(v for k, v in page.items() if k.startswith("gpu_exporter_host_read_failures_total")) >= 1
        assert peak_rss(agent) < 128 * MiB
    finally:
        code = agent.stop()
    assert code == 0, agent.log()[-3000:]


def test_a_sampler_stuck_in_a_vendor_call_is_unready_and_its_page_stale_and_sigterm_still_ends_it(
    tmp_path: Path,
) -> None:
    try:
        nvml_lib.build(tmp_path / "lib")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    scenario = nvml_lib.Scenario(gpus=1, cost_ms={"nvmlDeviceGetTemperature": 600_000})  # 10 minutes
    env = child_env(**scenario.environment(nvml_lib.device_nodes(tmp_path / "dev", scenario.gpus)))
    env["LD_LIBRARY_PATH"] = str(tmp_path / "lib")
    port = free_port()
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            exporter_cmd("--gpu-vendor=nvidia", FAST, f"--web.listen-address=127.0.0.1:{port}"),
            env=env,
            stdout=log,
            stderr=log,
        )
    try:

        def readyz() -> tuple[int, str]:
            status, body, _ = http_get(f"http://127.0.0.1:{port}/readyz", timeout=2)
            return status, body.decode()

        status, why = wait_until(lambda: readyz()[1].find("stuck") >= 0 and readyz(), 30, "/readyz: stuck")
        assert status == 503, why
        status, body, _ = http_get(f"http://127.0.0.1:{port}/metrics")
        page = series(body.decode())
        assert status == 200
        assert page["gpu_exporter_sampler_stale"] == 1
        assert not [name for name in page if name.startswith("gpu_") and not name.startswith("gpu_exporter_")]
        assert "process_resident_memory_bytes" in page  # the agent's own metrics, as they are now
        assert "no backend has read for" in log_path.read_text()  # and the log says so
    finally:
        code = stop_process(proc, timeout=15)
    assert code == 0, log_path.read_text()[-3000:]
