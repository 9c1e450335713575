"""The checks of ``gpu-exporter doctor`` that this node can answer by itself.

Each check takes a ``Node`` (the configuration plus every path and library it looks at, so that tests
point it at fixture trees and library fakes) and returns one ``Result``: ok, warn or fail, what was
found, and what to do. A check that does not apply to this configuration (another vendor, forwarding
off) says ``skip`` and why, never ``ok``: it looked at nothing.
"""

from __future__ import annotations

import glob
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_exporter import hostread
from gpu_exporter.config import Config

__all__ = ["CHECKS", "FAIL", "OK", "SKIP", "WARN", "Node", "Result", "skipped_vendor"]

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Result:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass
class Node:
    config: Config
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    dev: str = "/dev"
    nvml: Any = None  # the pynvml module (None: the installed one)
    amdsmi: Any = None  # the amdsmi module (None: the installed one)
    mqtt_timeout: float = 5.0
    clock: Callable[[], float] = time.time

    def wants(self, vendor: str) -> bool:
        return self.config.gpu_vendor in ("auto", vendor)


def skipped_vendor(name: str, node: Node) -> Result:
    return Result(name, SKIP, f"--gpu-vendor={node.config.gpu_vendor}")


def _library(node: Node, vendor: str) -> Result:
    from gpu_exporter.backends.base import BackendError

    name = f"{vendor}-library"
    if not node.wants(vendor):
        return skipped_vendor(name, node)
    backend: Any
    try:
        if vendor == "nvidia":
            from gpu_exporter.backends.nvidia.backend import NvmlBackend

            backend = NvmlBackend(node.config, nvml=node.nvml)
        else:
            from gpu_exporter.backends.amd.backend import AmdBackend

            backend = AmdBackend(node.config, node.amdsmi)
        backend.open()
    except BackendError as exc:
        status = FAIL if node.config.gpu_vendor == vendor else WARN
        return Result(name, status, str(exc), "fix the above, or set --gpu-vendor to this node's GPU vendor")
    try:
        samples = backend.read()
    finally:
        backend.close()
    info: Mapping[str, str] = next((s.info for s in samples if s.info), {})
    driver = info.get("driver_version", "unknown")
    return Result(name, OK, f"{len(samples)} device(s), driver {driver}")


def nvidia_library(node: Node) -> Result:
    """libnvidia-ml loads, matches the kernel driver (no version mismatch) and lists GPUs."""
    return _library(node, "nvidia")


def amd_library(node: Node) -> Result:
    """libamd_smi loads and lists GPUs."""
    return _library(node, "amd")


def device_nodes(node: Node) -> Result:
    """The GPU device nodes exist in this container and can be opened for reading and writing."""
    groups = []
    if node.wants("nvidia"):
        groups.append(
            ("nvidia", [os.path.join(node.dev, "nvidiactl"), *glob.glob(os.path.join(node.dev, "nvidia[0-9]*"))])
        )
    if node.wants("amd"):
        groups.append(("amd", [os.path.join(node.dev, "kfd"), *glob.glob(os.path.join(node.dev, "dri", "renderD*"))]))
    if not groups:
        return skipped_vendor("device-nodes", node)
    found = []
    for vendor, paths in groups:
        present = [p for p in paths if os.path.exists(p)]
        if not present:
            continue
        denied = [p for p in present if not os.access(p, os.R_OK | os.W_OK)]
        if denied:
            return Result(
                "device-nodes",
                FAIL,
                f"no read/write access to {', '.join(sorted(denied)[:3])}",
                "run the agent in the devices' group (ls -l shows it) or as root, as deploy/ does for the driver",
            )
        found.append(f"{len(present)} {vendor}")
    if found:
        return Result("device-nodes", OK, f"{', '.join(found)} device node(s) accessible")
    vendor = node.config.gpu_vendor
    return Result(
        "device-nodes",
        FAIL if vendor in ("nvidia", "amd") else WARN,
        f"no GPU device nodes under {node.dev}",
        "NVIDIA: run with the NVIDIA runtime (runtimeClassName: nvidia) and NVIDIA_VISIBLE_DEVICES=all; "
        "AMD: mount /dev/kfd and /dev/dri",
    )


def nvidia_runtime(node: Node) -> Result:
    """The NVIDIA container runtime's environment asks for every GPU and the utility capability."""
    name = "nvidia-runtime"
    if not node.wants("nvidia"):
        return skipped_vendor(name, node)
    env = node.environ
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    caps = env.get("NVIDIA_DRIVER_CAPABILITIES", "")
    in_kubernetes = "KUBERNETES_SERVICE_HOST" in env
    if visible is not None and visible.strip().lower() in ("", "void", "none"):
        return Result(
            name,
            FAIL,
            f"NVIDIA_VISIBLE_DEVICES={visible!r} hides every GPU",
            "set NVIDIA_VISIBLE_DEVICES=all (a monitor sees every GPU and requests none)",
        )
    if visible is not None and visible.strip().lower().startswith(("gpu-", "mig-")):
        return Result(
            name,
            WARN,
            f"NVIDIA_VISIBLE_DEVICES={visible} names single GPUs, as the device plugin does for a pod that "
            "requests nvidia.com/gpu",
            "remove the nvidia.com/gpu request (a monitor must not take a GPU) and set NVIDIA_VISIBLE_DEVICES=all",
        )
    if caps and not {"utility", "all"} & {c.strip().lower() for c in caps.split(",")}:
        return Result(
            name,
            FAIL,
            f"NVIDIA_DRIVER_CAPABILITIES={caps!r} lacks utility (NVML)",
            "set NVIDIA_DRIVER_CAPABILITIES=utility (or add it to the list)",
        )
    if visible is None and in_kubernetes:
        return Result(
            name,
            WARN,
            "NVIDIA_VISIBLE_DEVICES is not set in this pod",
            "set NVIDIA_VISIBLE_DEVICES=all in the DaemonSet (deploy/ does) and use the NVIDIA runtime class",
        )
    return Result(name, OK, f"NVIDIA_VISIBLE_DEVICES={visible or '(not in a container)'}")


def jetson_sysfs(node: Node) -> Result:
    """On a Jetson, the GPU's devfreq node is reachable under --path.sysfs."""
    from gpu_exporter.backends.jetson.backend import find_gpu

    name = "jetson-sysfs"
    if not node.wants("jetson"):
        return skipped_vendor(name, node)
    sysfs = Path(node.config.path_sysfs)
    try:
        gpu = find_gpu(sysfs)
    except OSError:
        gpu = None
    if gpu is not None:
        return Result(name, OK, f"GPU found under {sysfs}/class/devfreq")
    if node.config.gpu_vendor == "jetson":
        return Result(
            name,
            FAIL,
            f"no Jetson GPU under {sysfs}/class/devfreq",
            "mount the host's /sys read-only and point --path.sysfs at it",
        )
    return Result(name, OK, "not a Jetson (no Tegra GPU in devfreq)")


def pod_attribution(node: Node) -> Result:
    """With pod attribution on: the host's /proc (hostPID) and the pod-log directory are mounted."""
    name = "pod-attribution"
    c = node.config
    if not c.k8s_pod_attribution:
        return Result(name, SKIP, "pod attribution off (--k8s.pod-attribution=false)")
    cgroup = Path(c.path_procfs) / "1" / "cgroup"
    try:
        text = hostread.read_text(cgroup)
    except OSError as exc:
        return Result(
            name, FAIL, f"cannot read {cgroup}: {exc.strerror}", "mount the host's /proc and set --path.procfs"
        )
    if "kubepods" in text or not _kernel_threads(Path(c.path_procfs)):
        # Under cgroup v2 a container's own PID 1 reads "0::/" (its own cgroup namespace); but only the
        # host's PID namespace holds the kernel's threads (PID 2, kthreadd).
        return Result(
            name,
            FAIL,
            f"{c.path_procfs} is the container's own /proc (a pod's PID 1, no kernel threads)",
            "mount the host's /proc read-only and set --path.procfs to it (deploy/ uses /host/proc), "
            "or run the DaemonSet with hostPID: true",
        )
    logs = Path(c.k8s_pod_logs_path)
    if not logs.is_dir() or not os.access(logs, os.R_OK | os.X_OK):
        return Result(
            name,
            FAIL,
            f"{logs} is not a readable directory",
            "mount the kubelet's /var/log/pods read-only and set --k8s.pod-logs-path",
        )
    return Result(name, OK, f"{c.path_procfs} is the host's, {logs} readable")


def _kernel_threads(procfs: Path) -> bool:
    try:
        return hostread.read_text(procfs / "2" / "comm").strip() == "kthreadd"
    except OSError:
        return False


def spool(node: Node) -> Result:
    """With forwarding on: the spool directory is writable and has room for --spool.max-bytes."""
    name = "spool"
    c = node.config
    if not c.mqtt_url:
        return Result(name, SKIP, "forwarding off (no --mqtt.url)")
    directory = Path(c.spool_dir)
    probe = directory / f".doctor-{uuid.uuid4().hex}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as exc:
        return Result(
            name,
            FAIL,
            f"cannot write to {directory}: {exc.strerror}",
            "mount a writable hostPath there (deploy/ does) owned by the agent's user, or set --spool.dir",
        )
    free = shutil.disk_usage(directory).free
    if free < c.spool_max_bytes:
        return Result(
            name,
            WARN,
            f"{free >> 20} MiB free in {directory}, less than --spool.max-bytes={c.spool_max_bytes >> 20} MiB",
            "free space or lower --spool.max-bytes, so that a long outage fills the cap, not the disk",
        )
    return Result(name, OK, f"{directory} writable, {free >> 20} MiB free")


Check = Callable[[Node], Result]
CHECKS: tuple[Check, ...] = (
    nvidia_library,
    amd_library,
    device_nodes,
    nvidia_runtime,
    jetson_sysfs,
    pod_attribution,
    spool,
)
