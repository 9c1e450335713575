"""The session-end check under pytest-xdist (the README's test command runs the suite on workers): each
worker checks the processes its own tests started and hands them to the controller, which names them
with the worker and the test after which each was first seen, fails the session and leaves nothing
running. Each case is a real pytest session with two workers in a subprocess."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

from tests.support import wait_for
from tests.support.inner_session import LEAKY, TIDY, ours, run_session

_ours = ours


def _session(tmp_path: Path, source: str, token: str) -> subprocess.CompletedProcess[str]:
    return run_session(tmp_path, source, token, workers=2)


def test_a_process_a_worker_left_running_fails_the_session_is_named_and_stopped(tmp_path: Path) -> None:
    token = f"leak-{uuid.uuid4().hex[:12]}"
    result = _session(tmp_path, LEAKY, token)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "3 passed" in out, out
    assert "2 process(es) started by the tests outlived them" in out, out
    lines = {line for line in out.splitlines() if token in line}
    child = [line for line in lines if f"{token}-child" in line]
    daemon = [line for line in lines if f"{token}-daemon" in line]
    assert len(child) == 1 and "first seen after test_inner.py::test_forgets_a_child" in child[0], out
    assert len(daemon) == 1 and "first seen after test_inner.py::test_starts_a_daemon" in daemon[0], out
    assert all("[worker gw" in line for line in child + daemon), out
    assert not [line for line in lines if f"{token}-stopped" in line]
    assert wait_for(lambda: not _ours(token), timeout=10), _ours(token)


def test_workers_that_stop_what_they_started_pass(tmp_path: Path) -> None:
    token = f"tidy-{uuid.uuid4().hex[:12]}"
    result = _session(tmp_path, TIDY, token)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "outlived" not in out
