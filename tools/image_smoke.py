"""The smoke runs: each image started the way deploy/base/daemonset.yaml runs the container (read-only
root, UID 65532, every capability dropped, no new privileges, host network, a 16 MB /tmp), with its node
stood in for at the boundary.

- amd64, an NVIDIA node: the NVIDIA runtime's injection stood in for by tests/fakes/fake_nvml.c compiled
  to libnvidia-ml.so.1 and bound into the image's library folder, and stand-ins for the /dev/nvidia* nodes
  it adds; ``doctor`` passes and ``/metrics`` serves the simulated GPUs and process_*.
- arm64, a Jetson (tools/image_jetson.py), under qemu-user-static.
Both: no compiler in the image (every dependency came as a wheel).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from image_base import MULTIARCH
from image_engine import Engine, StepError, log, run
from image_jetson import smoke_jetson
from image_run import Container, daemonset_security, free_port, http_get, no_compiler

__all__ = ["container_args", "smoke"]

ROOT = Path(__file__).resolve().parent.parent


def fake_nvml(workdir: Path) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise StepError("a C compiler is needed for the simulated NVML library (apt-get install gcc libc6-dev)")
    lib = workdir / "nvidia" / "libnvidia-ml.so.1"
    lib.parent.mkdir(parents=True, exist_ok=True)
    run([compiler, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "tests" / "fakes" / "fake_nvml.c")])
    return lib


def nvidia_devices(workdir: Path, gpus: int) -> list[tuple[Path, str]]:
    """Stand-ins for the device nodes the NVIDIA runtime adds (/dev/nvidiactl, /dev/nvidia<N>, mode
    0666): the simulated library opens /dev/nvidiactl read-write and counts /dev/nvidia<N>, as the driver's
    does. Plain files: a real character device 195:N without the driver behind it cannot be opened."""
    folder = workdir / "nvidia-dev"
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name in ["nvidiactl", *(f"nvidia{i}" for i in range(gpus))]:
        path = folder / name
        path.touch()
        os.chmod(path, 0o666)
        out.append((path, f"/dev/{name}"))
    return out


def container_args(workdir: Path, gpus: int) -> list[str]:
    """``docker run`` options on the amd64 NVIDIA node: the DaemonSet's securityContext and the NVIDIA
    runtime's injection."""
    args = [
        *daemonset_security("linux/amd64"),
        f"--volume={fake_nvml(workdir)}:/usr/lib/{MULTIARCH['amd64']}/libnvidia-ml.so.1:ro",
    ]
    for host, inside in nvidia_devices(workdir, gpus):
        args.append(f"--volume={host}:{inside}")
    return args


def smoke_nvidia(engine: Engine, tag: str, workdir: Path) -> dict[str, object]:
    """doctor inside the image, then the agent serving /metrics, as the DaemonSet runs it."""
    gpus = 2
    base = container_args(workdir, gpus)
    user = engine.docker("run", "--rm", *base, "--entrypoint=id", tag).strip()
    log(f"in the container: {user}")
    doctor = engine.docker("run", "--rm", *base, tag, "doctor", "--gpu-vendor=nvidia", timeout=120)
    log("doctor:\n" + doctor.rstrip())
    if any(line.startswith("fail") for line in doctor.splitlines()):
        raise StepError("doctor reported a failure inside the image")
    version = engine.docker("run", "--rm", *base, tag, "--version").strip()
    log(f"--version: {version.splitlines()[0]}")
    port = free_port()
    agent_args = [
        "--gpu-vendor=nvidia",
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu-metrics-collection-interval=1s",
    ]
    container = Container(engine, tag, base, agent_args, port)
    page = ""
    try:

        def served() -> bool:
            nonlocal page
            page = http_get(f"{container.url}/metrics")[1]
            return "gpu_up{" in page

        container.wait("GPU series on /metrics", served, 60)
        logs = container.logs()
    finally:
        container.stop()
    gpu_up = [line for line in page.splitlines() if line.startswith("gpu_up{")]
    process = [line for line in page.splitlines() if line.startswith("process_resident_memory_bytes")]
    if len(gpu_up) != gpus or not all(line.endswith(" 1") for line in gpu_up) or not process:
        raise StepError(f"/metrics lacks the simulated GPUs or process_*:\n{page[:2000]}\nagent log:\n{logs}")
    log(f"/metrics: {len(gpu_up)} GPUs up, {process[0]}")
    return {"container_user": user, "doctor": doctor, "version": version, "gpu_up": gpu_up, "process": process}


def smoke(engine: Engine, tag: str, arch: str, workdir: Path) -> dict[str, object]:
    platform = f"linux/{arch}"
    no_compiler(engine, tag, platform)
    log(f"{tag}: no compiler, linker or make in the image")
    if arch == "amd64":
        return {"compilers": [], **smoke_nvidia(engine, tag, workdir / "smoke-amd64")}
    return {"compilers": [], **smoke_jetson(engine, tag, platform, workdir / f"smoke-{arch}")}
