"""One page per vendor from the CLI, end to end: ``python -m gpu_exporter --gpu-vendor=...`` as a child
process on fixtures, scraped once, compared as text with tests/golden/cli_<vendor>.prom.

What varies between runs is masked (tests/support/golden.py, ``normalise_page``: the agent's collect
timings and counts, timestamps, the process's resources, the build's revision and versions); everything
else is compared: each metric's name, HELP and TYPE, its labels and their order, every value as the page
formats it. ``UPDATE_GOLDEN=1`` rewrites the files; review the diff.

The vendors, each at its boundary only: NVIDIA is the real nvidia-ml-py over tests/fakes/fake_nvml.c
(compiled to libnvidia-ml.so.1, its clock frozen by FAKE_NVML_TIME); AMD is tests/fakes/fake_amdsmi.py as
the ``amdsmi`` module; Jetson is the Orin JetPack 6 sysfs/procfs tree; ``fake`` is the simulator, whose
readings follow the wall clock, so it runs with libfaketime holding that clock still.

The JetPack 7 boards run as the DaemonSet runs them, ``--gpu-vendor=auto`` with the NVIDIA library there
(fake_nvml.c answering as the board's NVML does, ``FAKE_NVML_BOARD``): on the Thor tree the Jetson backend
reads sysfs and takes utilization and processes from NVML, on the Orin JetPack 7 tree sysfs alone; on
both, NVML's view of the integrated GPU is no second, NVIDIA-backend GPU.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes import nvml_lib
from tests.support import FIXTURES, ROOT, SRC, Exporter, check_golden, child_env, promtool_check
from tests.support.faketime import faketime_env, libfaketime
from tests.support.golden import normalise_page

pytestmark = pytest.mark.integration

AMD_SHIM = """\
from tests.fakes.fake_amdsmi import FakeAmdSmi, mi210, mi300x

_fake = FakeAmdSmi([mi300x(0), mi210(1)])


def __getattr__(name):
    return getattr(_fake, name)
"""


def nvidia(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    scenario = nvml_lib.Scenario(gpus=2, mig=2)
    try:
        nvml_lib.build(tmp_path / "lib")
    except RuntimeError as exc:
        pytest.skip(str(exc))
    env = child_env(**scenario.environment(nvml_lib.device_nodes(tmp_path / "dev", scenario.gpus)))
    env["LD_LIBRARY_PATH"] = str(tmp_path / "lib")
    return ["--gpu-vendor=nvidia"], env


def amd(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "amdsmi.py").write_text(AMD_SHIM)
    return ["--gpu-vendor=amd"], child_env(PYTHONPATH=os.pathsep.join([str(shim), str(SRC), str(ROOT)]))


def jetpack7(board: str, nvml_board: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """A JetPack 7 board's tree with its NVML beside it, through --gpu-vendor=auto."""
    try:
        env = child_env(**nvml_lib.board_environment(tmp_path / "lib", nvml_board))
    except RuntimeError as exc:
        pytest.skip(str(exc))
    tree = FIXTURES / "jetson" / board
    return ["--gpu-vendor=auto", f"--path.sysfs={tree / 'sys'}", f"--path.procfs={tree / 'proc'}"], env


def jetson(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    board = FIXTURES / "jetson" / "orin-jp6"
    return ["--gpu-vendor=jetson", f"--path.sysfs={board / 'sys'}", f"--path.procfs={board / 'proc'}"], child_env()


def fake(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    library = libfaketime()
    if library is None:
        pytest.skip("libfaketime is not installed (Debian package faketime)")
    # an absolute time without '@': the wall clock stands still (the monotonic clock runs on)
    return ["--gpu-vendor=fake", "--fake.gpus=2", "--fake.mig=2"], faketime_env(
        child_env(), "2026-01-01 00:00:00", library
    )


VENDORS = {
    "nvidia": nvidia,
    "amd": amd,
    "jetson": jetson,
    "fake": fake,
    "jetson_thor": lambda tmp_path: jetpack7("thor", "thor", tmp_path),
    "jetson_orin-jp7": lambda tmp_path: jetpack7("orin-jp7", "orin", tmp_path),
}


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_the_cli_serves_the_golden_page(vendor: str, tmp_path: Path, exporter: type[Exporter]) -> None:
    args, env = VENDORS[vendor](tmp_path)
    proc = exporter(*args, env=env).start()
    page = proc.scrape()
    assert proc.stop() == 0, proc.output()
    promtool_check(page)
    check_golden(f"cli_{vendor}.prom", normalise_page(page))
