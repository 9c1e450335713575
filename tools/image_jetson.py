"""The arm64 image on a Jetson, under qemu-user-static, as the DaemonSet runs it.

The node is the Jetson Orin (JetPack 6) fixture tree: its sysfs bound read-only at /host/sys and its procfs
at /host/proc, where deploy/base/daemonset.yaml mounts the host's; the ConfigMap's config.yaml at
/etc/gpu-exporter; a spool folder owned by the agent's user at /var/lib/gpu-exporter; the kubelet's log
folders. The fixture's procfs lacks the kernel's threads that every host's /proc holds (doctor tells a
pod's own /proc by them), so the copy gets kthreadd as PID 2. As in tests/deploy/test_container.py, only
the ports and intervals change, through GPU_EXPORTER_* variables: a free port, seconds instead of
minutes, and a Mosquitto this tool starts on 127.0.0.1 (stopped by its PID) as the broker.

Inside: ``doctor`` passes (the broker reachable, the Jetson GPU found), ``/readyz`` is ready, ``/metrics``
serves the fixture's readings exactly as its golden page has them, and a batch with the GPU's readings
reaches the broker (read with mosquitto_sub, decoded with the project's own payload decoder).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from image_engine import Engine, StepError, log
from image_run import Container, daemonset_security, free_port, http_get

__all__ = ["FAMILIES", "configmap_config", "jetson_args", "smoke_jetson"]

ROOT = Path(__file__).resolve().parent.parent
BOARD = "orin-jp6"
NODE = "image-smoke"
# The golden page's families the container must serve exactly as the backend's tests do.
FAMILIES = (
    "gpu_up",
    "gpu_info",
    "gpu_utilization_ratio",
    "gpu_clock_hertz",
    "gpu_temperature_celsius",
    "gpu_power_rail_watts",
    "gpu_memory_total_bytes",
    "gpu_shared_memory_used_bytes",
)
# The DaemonSet's own args and the ConfigMap's file, changed only as tests/deploy/test_container.py does.
AGENT_ARGS = ("--config.file=/etc/gpu-exporter/config.yaml", "--path.sysfs=/host/sys")


def configmap_config() -> str:
    """config.yaml of deploy/base/configmap.yaml (a literal block: its lines, unindented)."""
    lines = (ROOT / "deploy" / "base" / "configmap.yaml").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "config.yaml: |") + 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for line in lines[start:]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        body.append(line[indent:])
    return "\n".join(body).rstrip() + "\n"


def node_tree(folder: Path) -> Path:
    """The board's /sys, /proc and /var/log, with procfs's and debugfs's own permissions."""
    fixture = ROOT / "tests" / "fixtures" / "jetson" / BOARD
    shutil.rmtree(folder, ignore_errors=True)
    for part in ("sys", "proc", "var"):
        shutil.copytree(fixture / part, folder / part, symlinks=True)
    for fd in (folder / "proc").glob("*/fd"):
        os.chmod(fd, 0o500)  # procfs: dr-x------ owned by the process's user (root here)
    kthreadd = folder / "proc" / "2"
    kthreadd.mkdir(exist_ok=True)
    (kthreadd / "comm").write_text("kthreadd\n")
    debugfs = folder / "sys" / "kernel" / "debug"
    if debugfs.exists():
        os.chmod(debugfs, 0o700)  # debugfs is root's only
    (folder / "etc").mkdir()
    (folder / "etc" / "config.yaml").write_text(configmap_config())
    spool = folder / "spool"
    spool.mkdir()
    os.chown(spool, 65532, 65532)  # what the DaemonSet's spool-owner init container does
    return folder


def jetson_args(platform: str, node: Path, web_port: int, mqtt_port: int) -> list[str]:
    """``docker run`` options: the DaemonSet's securityContext and volumes, bound from ``node``, and the
    test's GPU_EXPORTER_* overrides."""
    overrides = {
        "GPU_EXPORTER_WEB_LISTEN_ADDRESS": f"127.0.0.1:{web_port}",
        "GPU_EXPORTER_GPU_METRICS_COLLECTION_INTERVAL": "1s",
        "GPU_EXPORTER_MQTT_URL": f"mqtt://127.0.0.1:{mqtt_port}",
        "GPU_EXPORTER_MQTT_BATCH_INTERVAL": "2s",
        "GPU_EXPORTER_SPOOL_DIR": "/var/lib/gpu-exporter/spool",
    }
    return [
        *daemonset_security(platform),
        f"--volume={node / 'etc'}:/etc/gpu-exporter:ro",
        f"--volume={node / 'spool'}:/var/lib/gpu-exporter",
        f"--volume={node / 'proc'}:/host/proc:ro",
        f"--volume={node / 'sys'}:/host/sys:ro",
        f"--volume={node / 'var' / 'log' / 'pods'}:/var/log/pods:ro",
        f"--volume={node / 'var' / 'log' / 'containers'}:/var/log/containers:ro",
        *(f"--env={name}={value}" for name, value in overrides.items()),
    ]


class Mosquitto:
    """A broker on 127.0.0.1, stopped by its PID."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.conf = folder / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        self.logfile = folder / "mosquitto.log"
        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        with open(self.logfile, "wb") as out:
            self.proc = subprocess.Popen([binary, "-c", str(self.conf)], stdout=out, stderr=out)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "running" not in self.logfile.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise StepError(f"mosquitto exited {self.proc.returncode}: {self.logfile.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def golden() -> list[str]:
    page = (ROOT / "tests" / "golden" / f"jetson_{BOARD}.prom").read_text(encoding="utf-8")
    return [line for line in page.splitlines() if line.split("{")[0] in FAMILIES]


def decode_batch(data: bytes) -> Any:
    """The project's own decoder (stdlib only), from this checkout."""
    if str(ROOT / "src") not in sys.path:
        sys.path.insert(0, str(ROOT / "src"))
    from gpu_exporter.payload import decode

    return decode(data)


def smoke_jetson(engine: Engine, tag: str, platform: str, workdir: Path) -> dict[str, object]:
    node = node_tree(workdir / "node")
    expected = golden()
    uuid = expected[0].split('uuid="')[1].split('"')[0]
    broker = Mosquitto(workdir / "mosquitto")
    subscriber: subprocess.Popen[bytes] | None = None
    try:
        web_port = free_port()
        args = jetson_args(platform, node, web_port, broker.port)
        machine = engine.docker("run", "--rm", *args, "--entrypoint=uname", tag, "-m").strip()
        user = engine.docker("run", "--rm", *args, "--entrypoint=id", tag).strip()
        log(f"in the container: {machine}, {user}")
        if machine != "aarch64":
            raise StepError(f"the {platform} container runs as {machine}")
        doctor = engine.docker("run", "--rm", *args, tag, "doctor", *AGENT_ARGS, timeout=600)
        log("doctor:\n" + doctor.rstrip())
        if any(line.startswith("fail") for line in doctor.splitlines()):
            raise StepError("doctor reported a failure inside the image")
        topic = f"gpu-exporter/{NODE}/batch"
        subscriber = subprocess.Popen(
            # each payload as one line of hex: the agent's health reports share the topic with its batches
            ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port), "-t", topic, "-C", "6", "-F", "%x", "-q", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        started = time.monotonic()
        container = Container(engine, tag, args, list(AGENT_ARGS), web_port)
        page = ""
        try:
            container.wait("/readyz ready", lambda: http_get(f"{container.url}/readyz")[0] == 200, 300)
            ready_s = time.monotonic() - started

            def served() -> bool:
                nonlocal page
                page = http_get(f"{container.url}/metrics")[1]
                return all(line in page.splitlines() for line in expected)

            container.wait("the Jetson GPU's golden readings on /metrics", served, 120)
            try:
                data, _ = subscriber.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                raise StepError(f"no batch on {topic} within 180 s:\n{container.logs()}") from None
            payloads = [bytes.fromhex(line) for line in data.decode().split()]
            batches = [(raw, b) for raw in payloads if not (b := decode_batch(raw)).health]
            if not batches:
                raise StepError(f"no batch among the {len(payloads)} messages on {topic}:\n{container.logs()}")
            data, batch = batches[0]
            logs = container.logs()
        finally:
            stop_s = container.stop()
        devices = [d for s in batch.samples for d in s.devices]
        if batch.node != NODE or not any(d.device.uuid == uuid and ("utilization", ()) in d.values for d in devices):
            raise StepError(f"the batch on {topic} lacks {uuid}'s utilization: {batch!r:.500}")
        log(
            f"/metrics: {len(expected)} golden lines of {BOARD}; /readyz after {ready_s:.1f} s; a batch of "
            f"{len(data)} bytes with {len(batch.samples)} sample(s) on {topic}; SIGTERM to exit {stop_s:.1f} s"
        )
        return {
            "machine": machine,
            "container_user": user,
            "doctor": doctor,
            "golden_lines": len(expected),
            "ready_seconds": round(ready_s, 1),
            "batch_bytes": len(data),
            "batch_samples": len(batch.samples),
            "stop_seconds": round(stop_s, 1),
            "agent_log_tail": logs[-1500:],
        }
    finally:
        if subscriber is not None and subscriber.poll() is None:
            subscriber.terminate()
            subscriber.wait(10)
        broker.stop()
