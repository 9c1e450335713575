"""JetPack 7 nodes as the CLI sees them: a Jetson's NVML (tests/fakes/fake_nvml.c with FAKE_NVML_BOARD, under
the real nvidia-ml-py) beside its sysfs tree. The integrated GPU is the Jetson backend's, with its rails and
sensors, never a second GPU of the NVIDIA backend's; a discrete card in the slot stays the NVIDIA backend's.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fakes import nvml_lib
from tests.support import FIXTURES, Exporter, child_env, exporter_cmd, promtool_check, wait_for

pytestmark = pytest.mark.integration

THOR = FIXTURES / "jetson" / "thor"
ORIN = FIXTURES / "jetson" / "orin-jp7"


def node_env(tmp_path: Path, board: str, **extra: str) -> dict[str, str]:
    try:
        return child_env(**nvml_lib.board_environment(tmp_path / "lib", board, **extra))
    except RuntimeError as exc:
        pytest.skip(str(exc))


def paths(tree: Path) -> tuple[str, str]:
    return f"--path.sysfs={tree / 'sys'}", f"--path.procfs={tree / 'proc'}"


@pytest.mark.parametrize(("tree", "board", "name"), [(THOR, "thor", "NVIDIA Thor"), (ORIN, "orin", "Orin (nvgpu)")])
def test_the_nvidia_backend_leaves_the_integrated_gpu_to_the_jetson_backend(
    tmp_path: Path, tree: Path, board: str, name: str
) -> None:
    result = subprocess.run(
        exporter_cmd("--gpu-vendor=nvidia", *paths(tree)),
        env=node_env(tmp_path, board),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    [line] = [x for x in result.stderr.splitlines() if x.startswith("gpu-exporter:")]
    assert f"NVML lists only a Jetson's integrated GPU (0 ({name}))" in line
    assert "--gpu-vendor=jetson" in line
    assert "Traceback" not in result.stderr


def test_thor_whose_nvml_gives_no_utilization_names_it_once_and_serves_the_rest(
    tmp_path: Path, exporter: type[Exporter]
) -> None:
    env = node_env(tmp_path, "thor", FAKE_NVML_FAIL="nvmlDeviceGetUtilizationRates=3")  # NOT_SUPPORTED
    proc = exporter("--gpu-vendor=auto", *paths(THOR), env=env).start()
    page = proc.scrape()
    assert proc.stop() == 0
    log = proc.output()
    assert "gpu_utilization_ratio{" not in page
    for family in ("gpu_clock_hertz{", "gpu_temperature_celsius{", "gpu_power_rail_watts{", "gpu_processes{"):
        assert family in page, family
    assert 'gpu_memory_used_bytes{gpu="0",uuid="jetson-1581025003141"} 5368709120' in page  # its 2 + 3 GiB
    [line] = [x for x in log.splitlines() if "Jetson GPU tegra264" in x]
    assert "load not found" in line
    assert line.rstrip('"').endswith("could not read: utilization (no load file; NVML: not supported)"), line
    assert "auto-detect: using jetson (not found: nvidia: NVML lists only a Jetson's integrated GPU" in log
    promtool_check(page)


def test_a_discrete_card_in_a_jetson_is_the_nvidia_backends_beside_the_jetson_gpu(
    tmp_path: Path, exporter: type[Exporter]
) -> None:
    proc = exporter("--gpu-vendor=auto", *paths(ORIN), env=node_env(tmp_path, "")).start()
    page = proc.scrape()
    assert proc.stop() == 0
    assert 'name="NVIDIA H100 80GB HBM3"' in page
    assert 'name="NVIDIA Jetson AGX Orin Developer Kit (ga10b)"' in page
    assert 'gpu_exporter_backend_healthy{backend="nvidia"} 1.0' in page
    assert 'gpu_exporter_backend_healthy{backend="jetson"} 1.0' in page
    promtool_check(page)


def test_thors_gpu_processes_from_nvml_name_their_pods(tmp_path: Path, exporter: type[Exporter]) -> None:
    """KubeEdge on Thor: no pod-resources socket; NVML's process 4000 is a pod's by its cgroup, 4001 the host's."""
    proc = exporter(
        "--gpu-vendor=auto",
        *paths(THOR),
        "--k8s.pod-attribution=true",
        f"--k8s.pod-logs-path={THOR / 'var/log/pods'}",
        f"--k8s.kubelet-socket={tmp_path / 'no-kubelet.sock'}",
        "--gpu-metrics-collection-interval=200ms",
        env=node_env(tmp_path, "thor"),
    ).start()
    assert wait_for(lambda: "gpu_pod_info{" in proc.scrape(), timeout=10), proc.output()
    page = proc.scrape()
    assert proc.stop() == 0
    pods = [line for line in page.splitlines() if line.startswith("gpu_pod_")]
    [info] = [line for line in pods if line.startswith("gpu_pod_info{")]
    assert 'namespace="robotics"' in info and 'pod="planner-0"' in info and 'container="planner"' in info
    [memory] = [line for line in pods if line.startswith("gpu_pod_memory_used_bytes{")]
    assert memory.endswith(" 2147483648"), memory  # 2 GiB: NVML lists it twice (compute, graphics), counted once
    promtool_check(page)
