"""Through the real command: the agent on simulated GPUs, a fake kubelet that lists an idle pod holding a
DRA GPU, the node's CDI specs (fixtures in NVIDIA's driver format), per-process series and the DCGM view
split by pod, all from the flags a DaemonSet would pass. No API server anywhere."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import child_env, free_port, paths
from tests.support.k8s_fakes import Claim, ClaimResource, FakeKubelet

K8S = paths.FIXTURES / "k8s"
CLAIM = "0b6c9a4e-5d1f-4c2a-9e3b-7a8d6f5e4c31"  # the claim spec of the fixtures: gpu-1, /dev/nvidia1
TRAIN_UID = "7d1e2f3a-0000-4000-8000-00000000d7a1"


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[int]:
    kubelet = FakeKubelet().start()
    kubelet.pods = [
        (
            "dra-train",
            "ml",
            [
                (
                    "main",
                    [],
                    [Claim("train-gpu", "ml", [ClaimResource("gpu-1", [f"k8s.gpu.nvidia.com/claim={CLAIM}-gpu-1"])])],
                )
            ],
        )
    ]
    proc = tmp_path / "proc"
    for pid in (4000, 4010):  # the simulated driver's processes on GPU 0 and GPU 1: host processes here
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text("0::/system.slice/render.service\n")
        (proc / str(pid) / "comm").write_text("render\n")
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "gpu_exporter",
        "--gpu-vendor=fake",
        "--fake.gpus=2",
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu-metrics-collection-interval=200ms",
        "--node-name=edge-1",
        "--metrics.naming=dcgm",
        "--k8s.pod-attribution=true",
        "--k8s.virtual-gpus=true",
        "--processes.series=true",
        f"--path.procfs={proc}",
        f"--k8s.pod-logs-path={K8S / 'var' / 'log' / 'pods'}",
        f"--k8s.kubelet-socket={kubelet.socket}",
        f"--k8s.cdi-spec-dirs={K8S / 'cdi' / 'etc-cdi'},{K8S / 'cdi' / 'var-run-cdi'}",
    ]
    child = subprocess.Popen(args, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield port
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
        kubelet.stop()


def _scrape_until(port: int, needles: tuple[str, ...]) -> str:
    deadline = time.monotonic() + 60  # a bound for a failure only: a start at a load of 15 takes seconds
    page = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                page = response.read().decode()
            if all(n in page for n in needles):
                return page
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{needles!r} never all appeared; last page:\n{page[:3000]}")


@pytest.mark.integration
def test_an_idle_dra_pod_is_served_by_the_agent(agent: int) -> None:
    page = _scrape_until(agent, ('pod="dra-train"', "gpu_process_memory_used_bytes{"))
    info = [ln for ln in page.splitlines() if ln.startswith("gpu_pod_info{")]
    assert len(info) == 1 and 'gpu="1"' in info[0] and f'pod_uid="{TRAIN_UID}"' in info[0]
    uuid = info[0].split('uuid="')[1].split('"')[0]
    # the DCGM view: GPU 1's series are the pod's (it alone holds the GPU), GPU 0's nobody's
    temp = [ln for ln in page.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    assert any(f'UUID="{uuid}"' in ln and 'pod="dra-train"' in ln and 'hostname="edge-1"' in ln for ln in temp)
    assert any('gpu="0"' in ln and 'pod=""' in ln for ln in temp)
    # per-process series for the host processes, with their names and no pod
    procs = [ln for ln in page.splitlines() if ln.startswith("gpu_process_memory_used_bytes{")]
    assert len(procs) == 2 and all('process_name="render"' in ln and 'pod=""' in ln for ln in procs)
