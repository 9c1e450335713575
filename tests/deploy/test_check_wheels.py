"""tools/check_wheels.py, the CI step that fails when a runtime dependency has no arm64 wheel: the set it
resolves (what the image installs), and pip's answer from PyPI for the real set and for a copy of
pyproject.toml with a dependency that PyPI has as a source archive only (docopt 0.6.2)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import NOT_APPLICABLE
from tests.support import ROOT

TOOL = ROOT / "tools" / "check_wheels.py"
SDIST_ONLY = "docopt>=0.6"  # PyPI has docopt-0.6.2.tar.gz and no wheel


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_wheels", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300)


def _pyproject_with(tmp_path: Path, group: str, requirement: str) -> Path:
    """A copy of pyproject.toml with ``requirement`` added to ``dependencies`` or an extra."""
    text = (ROOT / "pyproject.toml").read_text()
    anchor = "dependencies = [\n" if group == "dependencies" else f"{group} = ["
    assert text.count(anchor) == 1, anchor
    copy = tmp_path / "pyproject.toml"
    copy.write_text(
        text.replace(
            anchor, f'{anchor}"{requirement}", ' if group != "dependencies" else f'{anchor}  "{requirement}",\n'
        )
    )
    return copy


# the tool reads pyproject.toml with tomllib: it runs in CI on the default Python (3.11+), not in the 3.10 leg
@pytest.mark.skipif(
    sys.version_info < (3, 11), reason=f"{NOT_APPLICABLE} tools/check_wheels.py needs Python 3.11+ (tomllib)"
)
def test_the_set_is_the_runtime_dependencies_the_kubernetes_extra_and_the_dockerfiles_amdsmi(tmp_path: Path) -> None:
    tool = _tool()
    requirements = tool.runtime_requirements(ROOT / "pyproject.toml", ROOT / "Dockerfile")
    names = {r.split(">")[0].split("=")[0].split("[")[0] for r in requirements}
    assert {"nvidia-ml-py", "paho-mqtt", "cramjam", "bcrypt", "grpcio"} <= names  # dependencies + kubernetes
    assert "amdsmi==7.0.*" in requirements  # as the image installs it (ARG AMDSMI)
    assert not names & {"pytest", "hypothesis", "ruff", "orjson"}  # test, dev and bridge extras are not shipped
    assert SDIST_ONLY in tool.runtime_requirements(
        _pyproject_with(tmp_path, "kubernetes", SDIST_ONLY), ROOT / "Dockerfile"
    )
    empty = tmp_path / "Dockerfile"
    empty.write_text((ROOT / "Dockerfile").read_text().replace('ARG AMDSMI="amdsmi==7.0.*"', "ARG AMDSMI="))
    assert not any(r.startswith("amdsmi") for r in tool.runtime_requirements(ROOT / "pyproject.toml", empty))


def test_platform_tags_cover_the_images_glibc_and_only_wheels_for_the_arch_fit() -> None:
    tool = _tool()
    tags = tool.platforms("aarch64", "2.36")
    assert (
        tags[0] == "manylinux_2_36_aarch64" and "manylinux_2_28_aarch64" in tags and tags[-1] == "manylinux2014_aarch64"
    )
    fits = tool._fits
    assert fits("bcrypt-5.0.0-cp39-abi3-manylinux2014_aarch64.manylinux_2_17_aarch64.whl", "aarch64", "3.11")
    assert fits("diskcache-5.6.3-py3-none-any.whl", "aarch64", "3.11")
    assert not fits("grpcio-1.85.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", "aarch64", "3.11")
    assert not fits("cramjam-2.14.0-cp312-cp312-manylinux_2_28_aarch64.whl", "aarch64", "3.11")
    assert not fits("docopt-0.6.2.tar.gz", "aarch64", "3.11")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "pyproject.toml"
    broken.write_text("[project\n")
    for args in (["--pyproject", str(broken)], ["--glibc", "2.5"], ["--dockerfile", str(tmp_path / "none")]):
        result = _run(*args)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_the_real_runtime_set_has_an_arm64_wheel_for_every_package() -> None:
    result = _run()
    assert result.returncode == 0, result.stderr
    assert "aarch64 (glibc 2.36), CPython 3.11" in result.stdout
    for name in ("grpcio", "cramjam", "bcrypt", "PyYAML", "amdsmi"):
        assert f" {name} " in result.stdout.replace("(", " ").replace(",", " "), result.stdout


@pytest.mark.integration
@pytest.mark.parametrize("group", ["dependencies", "kubernetes"])
def test_a_runtime_dependency_without_an_arm64_wheel_fails_the_step(tmp_path: Path, group: str) -> None:
    result = _run("--pyproject", str(_pyproject_with(tmp_path, group, SDIST_ONLY)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        "check_wheels: no aarch64 (glibc 2.36) wheel for CPython 3.11: docopt>=0.6 (binary wheels only)"
    ]


def test_ci_runs_the_check_before_the_tests() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "\npython3 tools/check_wheels.py\n" in ci
    assert ci.index("python3 tools/check_wheels.py") < ci.index("python3 -m pytest")
