"""A pod's /proc/<pid>/cgroup that never ends (/dev/zero, an endless file) costs that process its pod,
never the attribution thread's memory: the read is refused (hostread), counted, and the process is
taken for a non-pod one."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
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


def _within(seconds: float, call: Callable[[], object]) -> object:
    """``call()``'s result, or a failure when it has not returned in ``seconds`` (a blocked open)."""
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"still blocked after {seconds} s"
    return out[0]


def test_a_fifo_as_a_process_name_or_the_token_file_costs_that_value_not_a_hang(tmp_path: Path) -> None:
    """Every host file the pod code reads goes through hostread: a FIFO (no writer: a plain open blocks
    for ever) as a process's comm or as the service-account token is refused at once and counted."""
    from gpu_exporter.k8s.listing import fetch_items
    from gpu_exporter.k8s.processes import ProcessNames

    (tmp_path / "proc" / "4000").mkdir(parents=True)
    os.mkfifo(tmp_path / "proc" / "4000" / "comm")
    (tmp_path / "proc" / "4001").mkdir()
    (tmp_path / "proc" / "4001" / "comm").write_text("trainer\n")
    os.mkfifo(tmp_path / "token")
    before = hostread.failures()["not_regular"]
    names = ProcessNames(tmp_path / "proc")
    assert _within(5, lambda: names.get(4000)) == ""
    assert _within(5, lambda: names.get(4001)) == "trainer"

    def token() -> object:
        with pytest.raises(ValueError, match="cannot read the token file"):
            fetch_items("http://127.0.0.1:9/pods", str(tmp_path / "token"))
        return True

    assert _within(5, token)
    assert hostread.failures()["not_regular"] == before + 2
