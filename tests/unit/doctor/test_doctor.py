"""gpu-exporter doctor: every check fails on a fixture that has the problem, and passes without it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pynvml
import pytest

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.config import Config
from gpu_exporter.doctor import broker as broker_checks
from gpu_exporter.doctor import checks
from gpu_exporter.doctor.checks import Node
from tests.support import child_env, exporter_cmd, free_port, paths
from tests.support.mosquitto import Broker, make_tls

JETSON = paths.FIXTURES / "jetson" / "orin-jp6"


def test_nvidia_library_version_mismatch_fails_with_what_to_do() -> None:
    sim = SimNvml(gpus=1)
    sim.init_error = pynvml.NVMLError_LibRmVersionMismatch
    result = checks.nvidia_library(Node(Config(gpu_vendor="nvidia"), nvml=sim))
    assert result.status == "fail" and "version mismatch" in result.detail and "reboot" in result.detail
    ok = checks.nvidia_library(Node(Config(gpu_vendor="nvidia"), nvml=SimNvml(gpus=2)))
    assert ok.status == "ok" and "2 device(s)" in ok.detail


def test_nvidia_library_missing_fails_when_asked_for_and_warns_under_auto() -> None:
    sim = SimNvml(gpus=1)
    sim.init_error = pynvml.NVMLError_LibraryNotFound
    assert checks.nvidia_library(Node(Config(gpu_vendor="nvidia"), nvml=sim)).status == "fail"
    assert checks.nvidia_library(Node(Config(gpu_vendor="auto"), nvml=sim)).status == "warn"


def test_amd_library_missing_fails_with_the_real_amdsmi_package() -> None:
    result = checks.amd_library(Node(Config(gpu_vendor="amd")))
    if result.status == "ok":  # pragma: no cover - a machine with ROCm
        pytest.skip("not applicable here: this machine has libamd_smi.so")
    assert result.status == "fail" and "libamd_smi" in result.detail


def test_device_nodes_missing_or_present(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    missing = checks.device_nodes(Node(Config(gpu_vendor="nvidia"), dev=str(dev)))
    assert missing.status == "fail" and "NVIDIA runtime" in missing.fix
    (dev / "nvidiactl").write_bytes(b"")
    (dev / "nvidia0").write_bytes(b"")
    assert checks.device_nodes(Node(Config(gpu_vendor="nvidia"), dev=str(dev))).status == "ok"


@pytest.mark.parametrize(
    ("environ", "status"),
    [
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, "fail"),
        ({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute"}, "fail"),
        ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "warn"),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-5e1d6b7a-0c3f-4a61-9f0e-1b2c3d4e5f60"}, "warn"),
        ({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}, "ok"),
    ],
)
def test_nvidia_runtime_environment(environ: dict[str, str], status: str) -> None:
    assert checks.nvidia_runtime(Node(Config(gpu_vendor="nvidia"), environ=environ)).status == status


def test_jetson_sysfs_unreachable_fails(tmp_path: Path) -> None:
    empty = checks.jetson_sysfs(Node(Config(gpu_vendor="jetson", path_sysfs=str(tmp_path))))
    assert empty.status == "fail" and "--path.sysfs" in empty.fix
    found = checks.jetson_sysfs(Node(Config(gpu_vendor="jetson", path_sysfs=str(JETSON / "sys"))))
    assert found.status == "ok"


def _procfs(root: Path, cgroup: str) -> str:
    (root / "1").mkdir(parents=True)
    (root / "1" / "cgroup").write_text(cgroup)
    (root / "2").mkdir()
    (root / "2" / "comm").write_text("kthreadd\n")  # the host's PID namespace holds the kernel's threads
    return str(root)


def test_pod_attribution_needs_the_hosts_proc_and_the_pod_logs(tmp_path: Path) -> None:
    logs = tmp_path / "pods"
    logs.mkdir()

    def run(procfs: str, pod_logs: str) -> checks.Result:
        config = Config(k8s_pod_attribution=True, path_procfs=procfs, k8s_pod_logs_path=pod_logs)
        return checks.pod_attribution(Node(config))

    own = _procfs(tmp_path / "own", "0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-ab.scope\n")
    host = _procfs(tmp_path / "host", "0::/init.scope\n")
    assert run(str(tmp_path / "none"), str(logs)).status == "fail"
    result = run(own, str(logs))
    assert result.status == "fail" and "hostPID" in result.fix
    assert run(host, str(tmp_path / "no-logs")).status == "fail"
    assert run(host, str(logs)).status == "ok"


def test_spool_not_writable_or_too_small(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    config = Config(mqtt_url="mqtt://127.0.0.1:1", spool_dir=str(blocker / "spool"))
    assert checks.spool(Node(config)).status == "fail"
    config = Config(mqtt_url="mqtt://127.0.0.1:1", spool_dir=str(tmp_path / "spool"), spool_max_bytes=1 << 50)
    assert checks.spool(Node(config)).status == "warn"
    config = Config(mqtt_url="mqtt://127.0.0.1:1", spool_dir=str(tmp_path / "spool"), spool_max_bytes=1 << 16)
    assert checks.spool(Node(config)).status == "ok"


def test_broker_unreachable_refused_and_accepted(tmp_path: Path) -> None:
    closed = checks.Node(Config(mqtt_url=f"mqtt://127.0.0.1:{free_port()}"))
    result = broker_checks.broker(closed)
    assert result.status == "fail" and "cannot reach" in result.detail
    b = Broker(tmp_path / "mosquitto", users={"edge": "right"})
    b.start()
    try:
        wrong = tmp_path / "wrong"
        wrong.write_text("wrong\n")
        right = tmp_path / "right"
        right.write_text("right\n")
        config = Config(mqtt_url=b.url, mqtt_username="edge", mqtt_password_file=str(wrong))
        result = broker_checks.broker(Node(config))
        assert result.status == "fail" and "refused" in result.detail
        config = Config(mqtt_url=b.url, mqtt_username="edge", mqtt_password_file=str(right))
        assert broker_checks.broker(Node(config)).status == "ok"
    finally:
        b.stop()


def test_broker_tls_with_the_wrong_ca_fails_and_the_right_one_passes(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls", client=False)
    other = make_tls(tmp_path / "other", client=False)
    b = Broker(tmp_path / "mosquitto", tls=tls)
    b.start()
    try:
        result = broker_checks.broker(Node(Config(mqtt_url=b.url, mqtt_tls_ca_file=other["ca"])))
        assert result.status == "fail" and "TLS" in result.detail
        good = Config(mqtt_url=b.url, mqtt_tls_ca_file=tls["ca"])
        assert broker_checks.broker(Node(good)).status == "ok"
        assert broker_checks.clock(Node(good)).status == "ok"
    finally:
        b.stop()


def test_a_clock_before_this_release_fails_when_forwarding() -> None:
    forwarding = Config(mqtt_url="mqtt://127.0.0.1:1")
    result = broker_checks.clock(Node(forwarding, clock=lambda: 946684800.0))  # 2000-01-01
    assert result.status == "fail" and "NTP" in result.fix
    assert broker_checks.clock(Node(forwarding)).status == "ok"


def test_the_clock_is_skipped_without_forwarding() -> None:
    """Scraped samples get the scraper's timestamps: a wrong clock matters only to forwarded ones."""
    result = broker_checks.clock(Node(Config(), clock=lambda: 946684800.0))
    assert result.status == "skip" and "--mqtt.url" in result.detail


def test_doctor_command_exits_1_with_json_naming_the_failure(tmp_path: Path) -> None:
    result = subprocess.run(
        exporter_cmd("doctor", "--gpu-vendor=jetson", f"--path.sysfs={tmp_path}", "--output=json"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    failed = {c["name"] for c in report["checks"] if c["status"] == "fail"}
    assert failed == {"jetson-sysfs"}
    text = subprocess.run(
        exporter_cmd("doctor", "--gpu-vendor=jetson", f"--path.sysfs={JETSON / 'sys'}"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert text.returncode == 0, text.stdout
    assert all(line.split()[0] in ("ok", "warn", "skip") for line in text.stdout.splitlines()), text.stdout
    assert len(text.stdout.splitlines()) == len(report["checks"])


def test_doctor_bad_flag_is_one_line_exit_2() -> None:
    result = subprocess.run(
        exporter_cmd("doctor", "--gpu-metrics-collection-interval=99999999999999d"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1


def test_doctor_says_skip_for_what_it_did_not_check(tmp_path: Path) -> None:
    """Another vendor's checks, pod attribution, spool, broker and clock without forwarding: "skip" (in
    JSON too), never "ok ... not checked"."""
    result = subprocess.run(
        exporter_cmd("doctor", "--gpu-vendor=jetson", f"--path.sysfs={JETSON / 'sys'}", "--output=json"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    status = {c["name"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert status == {
        "nvidia-library": "skip",
        "amd-library": "skip",
        "device-nodes": "skip",
        "nvidia-runtime": "skip",
        "jetson-sysfs": "ok",
        "pod-attribution": "skip",
        "spool": "skip",
        "mqtt-broker": "skip",
        "clock": "skip",
    }
    assert "not checked" not in result.stdout
