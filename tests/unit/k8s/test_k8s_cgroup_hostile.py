"""A pod's /proc/<pid>/cgroup that never ends (/dev/zero, an endless file) costs that process its pod,
never the attribution thread's memory: the read is refused (hostread), counted, and the process is
taken for a non-pod one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpu_exporter import hostread
from gpu_exporter.k8s import cgroup
from tests.support import paths

PROC = paths.FIXTURES / "k8s" / "proc"


@pytest.mark.parametrize(("kind", "reason"), [("/dev/zero", "not_regular"), ("endless", "too_large")])
def test_a_cgroup_file_that_never_ends_is_no_pod(tmp_path: Path, kind: str, reason: str) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(PROC, proc, symlinks=True)
    hostile = proc / "1001" / "cgroup"
    hostile.unlink()
    if kind == "/dev/zero":
        hostile.symlink_to("/dev/zero")
    else:
        with open(hostile, "wb") as handle:
            handle.truncate(64 << 30)  # 64 GiB of NULs, sparse
    before = hostread.failures()[reason]
    assert cgroup.read_pid(proc, 1001) is None
    assert hostread.failures()[reason] == before + 1
    assert cgroup.read_pid(proc, 1002) is not None  # the other pods' processes are read as before
