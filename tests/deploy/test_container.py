"""The DaemonSet's container, run as a container runtime would run it, on each vendor's node.

deploy/daemonset.yaml (and, for AMD nodes, deploy/kubeedge with deploy/components/amd; for Jetson pods,
with deploy/components/jetson-processes) is parsed as written and run by tests/support/container_sandbox.py:
the manifest's user, groups and capabilities, a read-only root, a masked /sys/firmware, only the volumes
it declares, bound from a fixture node, its env and args. Each node must serve its real readings on
/metrics and forward them to a real Mosquitto; a manifest changed so that a vendor breaks must fail.

What the test changes in the manifest's configuration, through GPU_EXPORTER_* variables (which the
agent ranks above the ConfigMap): the listening port and the broker's port (free ports, since tests
share this machine), and the sample and batch intervals (seconds instead of minutes).

The vendor libraries at the boundary:
- NVIDIA: tests/fakes/fake_nvml.c, compiled to libnvidia-ml.so.1 and injected where the NVIDIA runtime
  puts the driver's library; the real nvidia-ml-py loads it with ctypes and needs /dev/nvidiactl.
- AMD: tests/fakes/fake_amdsmi.py as the image's ``amdsmi`` package, which like the real one looks for
  libamd_smi.so under $ROCM_PATH/lib at import and opens /dev/kfd and /dev/dri at init.
- Jetson: the fixture trees of an Orin on JetPack 6 and a Xavier on JetPack 4, as the node's /sys and
  /proc (procfs's own permissions kept: fd folders 0500, debugfs 0700).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter import config
from tests.fakes import nvml_lib
from tests.support import container_sandbox as sandbox
from tests.support import free_port, http_get, kustomize_lite, paths, wait_for
from tests.support.mosquitto import Broker, Collector, make_tls

ROOT = paths.ROOT
DEPLOY = ROOT / "deploy"
FIXTURES = paths.FIXTURES
NODE = "edge-gpu-7"
RENDER_GID = 109  # deploy/components/amd's supplementalGroups: Ubuntu's render group

WHY_NOT = sandbox.available()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "-")


def manifest() -> list[dict[str, Any]]:
    """deploy/daemonset.yaml as written."""
    return [d for d in yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text(encoding="utf-8")) if d]


def with_component(tmp_path: Path, component: str) -> list[dict[str, Any]]:
    where = tmp_path / f"kubeedge-{component}"
    where.mkdir()
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / "kubeedge", where)],
                "components": [os.path.relpath(DEPLOY / "components" / component, where)],
            }
        )
    )
    return kustomize_lite.build(where)


# --- nodes ---------------------------------------------------------------------------------------


def jetson_node(tmp_path: Path, board: str) -> sandbox.Node:
    """A Jetson's filesystem: the board's sysfs and procfs, and the kubelet's log folders."""
    host = tmp_path / "node"
    fixture = FIXTURES / "jetson" / board
    shutil.copytree(fixture / "sys", host / "sys", symlinks=True)
    shutil.copytree(fixture / "proc", host / "proc", symlinks=True)
    if (fixture / "var").exists():
        shutil.copytree(fixture / "var", host / "var", symlinks=True)
    for fd in (host / "proc").glob("*/fd"):
        os.chmod(fd, 0o500)  # procfs: dr-x------ owned by the process's user (root here)
    debugfs = host / "sys" / "kernel" / "debug"
    if debugfs.exists():
        os.chmod(debugfs, 0o700)  # debugfs is root's only
    return sandbox.Node(root=host, sysfs=host / "sys")


def _machine_node(host: Path) -> None:
    """/proc and /sys of this machine (the node is this machine for a PCIe GPU)."""
    host.mkdir(parents=True)
    (host / "proc").symlink_to("/proc")
    (host / "sys").symlink_to("/sys")


@pytest.fixture(scope="module")
def nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        return nvml_lib.build(tmp_path_factory.mktemp("nvml"))
    except RuntimeError as exc:
        pytest.fail(str(exc))


def nvidia_node(tmp_path: Path, library: Path) -> sandbox.Node:
    host = tmp_path / "node"
    _machine_node(host)
    return sandbox.Node(root=host, nvidia_library=library, nvidia_devices=("nvidiactl", "nvidia0", "nvidia1"))


AMDSMI_SHIM = '''\
"""The image's amdsmi package, on a simulated AMD node: tests/fakes/fake_amdsmi.py behind the real
package's import-time library lookup and its device access at init."""
import os
import sys

_rocm = os.environ.get("ROCM_HOME", os.environ.get("ROCM_PATH"))
if not (_rocm and os.path.exists(os.path.join(_rocm, "lib", "libamd_smi.so"))):
    print("Unable to find libamd_smi.so library try installing amd-smi-lib from your package manager")
    raise KeyError("libamd_smi.so")

from amdsmi._fake import AmdSmiLibraryException, FakeAmdSmi, mi210, mi300x  # noqa: E402

_fake = FakeAmdSmi([mi300x(0), mi210(1)])


def amdsmi_init(flag):
    for node in ("/dev/kfd", "/dev/dri/renderD128"):
        try:
            os.close(os.open(node, os.O_RDWR))
        except OSError:
            raise AmdSmiLibraryException(10) from None  # AMDSMI_STATUS_NO_PERM
    return _fake.amdsmi_init(flag)


def __getattr__(name):
    return getattr(_fake, name)
'''


def amd_node(tmp_path: Path) -> sandbox.Node:
    host = tmp_path / "node"
    _machine_node(host)
    lib = host / "opt" / "rocm" / "lib"
    lib.mkdir(parents=True)
    (lib / "libamd_smi.so").write_bytes(b"\x7fELF (stand-in: the simulated package only looks for it)")
    (host / "dev" / "dri").mkdir(parents=True)
    for node in ("dev/kfd", "dev/dri/renderD128", "dev/dri/renderD129"):
        (host / node).touch()
        os.chown(host / node, 0, RENDER_GID)
        os.chmod(host / node, 0o660)  # crw-rw---- root:render
    packages = tmp_path / "image-packages"
    (packages / "amdsmi").mkdir(parents=True)
    (packages / "amdsmi" / "__init__.py").write_text(AMDSMI_SHIM)
    shutil.copy2(paths.FAKES / "fake_amdsmi.py", packages / "amdsmi" / "_fake.py")
    return sandbox.Node(root=host, image_packages=packages)


# --- running the pod -----------------------------------------------------------------------------


class Pod:
    """The manifest's init containers, then its agent, on one node."""

    def __init__(self, docs: list[dict[str, Any]], node: sandbox.Node, workdir: Path) -> None:
        self.inits, self.agent = sandbox.containers(docs)
        self.node = node
        self.workdir = workdir
        self.port = free_port()
        self.log = workdir / "agent.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def overrides(self, broker: Broker | None) -> dict[str, str]:
        env = {
            config.env_name("web.listen-address"): f"127.0.0.1:{self.port}",
            config.env_name("gpu-metrics-collection-interval"): "500ms",
            config.env_name("mqtt.batch-interval"): "1s",
        }
        if broker is not None:
            env[config.env_name("mqtt.url")] = broker.url
        return env

    def start(self, broker: Broker | None = None) -> str:
        """Run the pod; the agent's /metrics page once it is ready. AssertionError if it never is."""
        for init in self.inits:
            done = sandbox.Sandbox(init, self.node, NODE, self.workdir / init.name).run()
            assert done.returncode == 0, f"init container {init.name} failed: {done.stdout}{done.stderr}"
        runner = sandbox.Sandbox(self.agent, self.node, NODE, self.workdir / self.agent.name)
        self.proc = runner.start(self.log, self.overrides(broker))
        url = f"http://127.0.0.1:{self.port}"
        ready = wait_for(lambda: self.proc is not None and (self.proc.poll() is not None or self._ready(url)), 30)
        assert ready and self.proc.poll() is None, f"agent not ready (exit {self.proc.poll()}):\n{self.output()}"
        status, body, _ = http_get(f"{url}/metrics")
        assert status == 200
        return body.decode()

    @staticmethod
    def _ready(url: str) -> bool:
        try:
            return http_get(f"{url}/readyz", timeout=1)[0] == 200
        except OSError:
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> int:
        return sandbox.stop(self.proc) if self.proc is not None else 0


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """The cloud broker, over TLS with client certificates, as the KubeEdge overlay expects it."""
    tls = make_tls(tmp_path / "pki")
    b = Broker(tmp_path / "mosquitto", tls={**tls, "require_certificate": "true"})
    b.start()
    try:
        yield b
    finally:
        b.stop()


def golden_lines(path: Path, *families: str) -> list[str]:
    """The lines of the backend's expected page (its fixture golden) for these families."""
    return [ln for ln in path.read_text().splitlines() if ln.split("{")[0] in families]


def provision_credentials(node: sandbox.Node, tls: dict[str, str]) -> None:
    """What docs/kubernetes.md has an operator do when a node joins: its client certificate, key and the
    broker's CA in the host's /etc/gpu-exporter/mqtt, readable by the agent's user."""
    folder = node.root / "etc" / "gpu-exporter" / "mqtt"
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in (("ca.crt", tls["ca"]), ("tls.crt", tls["client_cert"]), ("tls.key", tls["client_key"])):
        shutil.copyfile(source, folder / name)
        os.chmod(folder / name, 0o644)


def serve_and_forward(pod: Pod, broker: Broker, expected: list[str], uuid: str) -> str:
    """The pod serves ``expected`` on /metrics and its batches reach the broker with ``uuid``'s readings."""
    assert broker.tls is not None
    provision_credentials(pod.node, broker.tls)
    tls = broker.tls
    with Collector(broker, tls_ca=tls["ca"], tls_cert=tls["client_cert"], tls_key=tls["client_key"]) as collector:
        page = pod.start(broker)

        def missing() -> list[str]:
            nonlocal page
            page = http_get(f"http://127.0.0.1:{pod.port}/metrics")[1].decode()
            return [ln for ln in expected if ln not in page.splitlines()]

        wait_for(lambda: not missing(), 10)  # the page follows the samples; a loaded machine lags
        assert not missing(), f"not on the page: {missing()}\n{page}\n{pod.output()}"

        def forwarded() -> bool:
            with collector._lock:
                return any(
                    d.device.uuid == uuid and ("utilization", ()) in d.values
                    for b in collector.batches
                    if b.node == NODE
                    for s in b.samples
                    for d in s.devices
                )

        assert wait_for(forwarded, 30), f"no batch from {NODE} with {uuid}:\n{pod.output()}\n{broker.log()}"
    # pod attribution follows the samples on its own thread: by now it has seen several
    return http_get(f"http://127.0.0.1:{pod.port}/metrics")[1].decode()


# --- each vendor's node --------------------------------------------------------------------------

NVIDIA_LINES = [  # the simulator's readings at its start (fake_nvml.c computes them as SimNvml does)
    'gpu_utilization_ratio{gpu="0",uuid="GPU-00000000-0000-4000-8000-000000000000"} 0.5',
    'gpu_utilization_ratio{gpu="1",uuid="GPU-00000000-0001-4000-8000-000000000001"} 0.99',
    'gpu_memory_used_bytes{gpu="0",uuid="GPU-00000000-0000-4000-8000-000000000000"} 59051216896',
    'gpu_power_watts{gpu="0",uuid="GPU-00000000-0000-4000-8000-000000000000"} 345',
    'gpu_temperature_celsius{gpu="1",uuid="GPU-00000000-0001-4000-8000-000000000001",sensor="gpu"} 73',
]


def check_nvidia(docs: list[dict[str, Any]], tmp_path: Path, library: Path, broker: Broker, pods: list[Pod]) -> None:
    pod = Pod(docs, nvidia_node(tmp_path, library), tmp_path / "pod")
    pods.append(pod)
    page = serve_and_forward(pod, broker, NVIDIA_LINES, "GPU-00000000-0000-4000-8000-000000000000")
    assert 'name="NVIDIA H100 80GB HBM3"' in page


def test_nvidia_node(tmp_path: Path, nvml_library: Path, broker: Broker, pods: list[Pod]) -> None:
    check_nvidia(manifest(), tmp_path, nvml_library, broker, pods)


def test_nvidia_node_without_the_nvidia_runtime_fails(
    tmp_path: Path, nvml_library: Path, broker: Broker, pods: list[Pod]
) -> None:
    docs = manifest()
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    del daemonset["spec"]["template"]["spec"]["runtimeClassName"]
    with pytest.raises(AssertionError, match="agent not ready"):
        check_nvidia(docs, tmp_path, nvml_library, broker, pods)
    assert "libnvidia-ml.so.1 not found" in pods[-1].output()


AMD_GOLDEN = paths.GOLDEN / "amd_mi300x_mi210.prom"


def serve_golden(
    docs: list[dict[str, Any]],
    node: sandbox.Node,
    tmp_path: Path,
    golden: Path,
    families: tuple[str, ...],
    broker: Broker,
    pods: list[Pod],
) -> tuple[str, str]:
    """The agent on ``node`` serves the golden file's lines of ``families`` and forwards its first GPU's
    samples: (the page, that GPU's uuid)."""
    pod = Pod(docs, node, tmp_path / "pod")
    pods.append(pod)
    expected = golden_lines(golden, *families)
    assert len(expected) >= 6
    uuid = expected[0].split('uuid="')[1].split('"')[0]
    return serve_and_forward(pod, broker, expected, uuid), uuid


AMD_FAMILIES = ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_power_watts", "gpu_temperature_celsius")


def check_amd(docs: list[dict[str, Any]], tmp_path: Path, broker: Broker, pods: list[Pod]) -> None:
    serve_golden(docs, amd_node(tmp_path), tmp_path, AMD_GOLDEN, AMD_FAMILIES, broker, pods)


def test_amd_node(tmp_path: Path, broker: Broker, pods: list[Pod]) -> None:
    check_amd(with_component(tmp_path, "amd"), tmp_path, broker, pods)


@pytest.mark.parametrize(
    "break_it, says",
    [
        ("rocm", "AMD SMI library not found"),  # the ROCm mount dropped
        ("privileged", "permission denied"),  # the device cgroup then refuses /dev/kfd
        ("groups", "permission denied"),  # not in the render group
    ],
)
def test_amd_node_without_what_amd_smi_needs_fails(
    tmp_path: Path, broker: Broker, pods: list[Pod], break_it: str, says: str
) -> None:
    docs = with_component(tmp_path, "amd")
    spec = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    agent = spec["containers"][0]
    if break_it == "rocm":
        agent["volumeMounts"] = [m for m in agent["volumeMounts"] if m["mountPath"] != "/opt/rocm"]
    elif break_it == "privileged":
        del agent["securityContext"]["privileged"]
    else:
        del spec["securityContext"]["supplementalGroups"]
    with pytest.raises(AssertionError, match="agent not ready"):
        check_amd(docs, tmp_path, broker, pods)
    assert says in pods[-1].output()


JETSON_FAMILIES = (
    "gpu_utilization_ratio",
    "gpu_clock_hertz",
    "gpu_temperature_celsius",
    "gpu_power_rail_watts",
    "gpu_memory_total_bytes",
    "gpu_shared_memory_used_bytes",
)


def check_jetson(docs: list[dict[str, Any]], tmp_path: Path, board: str, broker: Broker, pods: list[Pod]) -> str:
    golden = paths.GOLDEN / f"jetson_{board}.prom"
    page, uuid = serve_golden(docs, jetson_node(tmp_path, board), tmp_path, golden, JETSON_FAMILIES, broker, pods)
    # the uuid from the device tree's serial number: the same series as an agent on the host writes
    assert uuid != "jetson-" and not uuid.startswith("jetson-1700")
    return page


@pytest.mark.parametrize("board", ["orin-jp6", "xavier-jp4"])
def test_jetson_node(tmp_path: Path, broker: Broker, pods: list[Pod], board: str) -> None:
    page = check_jetson(manifest(), tmp_path, board, broker, pods)
    # the default agent is not root: it may not read the pods' /proc/<pid>/fd, so it names no pod
    assert "gpu_pod_info" not in page
    assert "cannot read the open files of" in pods[-1].output()


@pytest.mark.parametrize("board", ["orin-jp6", "xavier-jp4"])
def test_jetson_node_names_its_gpu_pods_with_the_processes_component(
    tmp_path: Path, broker: Broker, pods: list[Pod], board: str
) -> None:
    page = check_jetson(with_component(tmp_path, "jetson-processes"), tmp_path, board, broker, pods)
    info = sorted(ln for ln in page.splitlines() if ln.startswith("gpu_pod_info{"))
    expected = {
        "orin-jp6": ['pod="analytics-0",container="detector"', 'pod="tracker-5d8f9",container="tracker"'],
        "xavier-jp4": ['pod="analytics-1",container="detector"', 'pod="recorder-0",container="encoder"'],
    }[board]
    assert len(info) == 2 and all(want in line for want, line in zip(expected, info, strict=True)), info
    # as root with CAP_DAC_READ_SEARCH it reads nvmap's debugfs table: per-pod GPU memory
    assert "gpu_pod_memory_used_bytes{" in page
    assert 'gpu_memory_used_bytes{gpu="0"' in page


def test_jetson_node_without_the_hosts_sysfs_fails(tmp_path: Path, broker: Broker, pods: list[Pod]) -> None:
    docs = manifest()
    agent = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    agent["volumeMounts"] = [m for m in agent["volumeMounts"] if m["mountPath"] != "/host/sys"]
    with pytest.raises(AssertionError, match="agent not ready"):
        check_jetson(docs, tmp_path, "orin-jp6", broker, pods)
    assert "does not look like sysfs" in pods[-1].output()


def test_jetson_node_reading_the_masked_sysfs_loses_the_identity(
    tmp_path: Path, broker: Broker, pods: list[Pod]
) -> None:
    """Without the host's /sys the GPU is still found in the container's own (masked) /sys, but its
    serial number is not: the series would change identity between a host agent and the pod."""
    docs = copy.deepcopy(manifest())
    agent = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    agent["args"] = [a for a in agent["args"] if not a.startswith("--path.sysfs")]
    with pytest.raises(AssertionError, match="not on the page"):
        check_jetson(docs, tmp_path, "orin-jp6", broker, pods)
    assert 'uuid="jetson-17000000.gpu"' in http_get(f"http://127.0.0.1:{pods[-1].port}/metrics")[1].decode()
