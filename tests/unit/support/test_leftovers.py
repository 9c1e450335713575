"""The session-end check (tests/conftest.py, tests/support/leftovers.py): a process a test leaves running fails
the session, named with the test after which it was first seen, and is stopped; so is a daemon that
forked away from its parent (the session is a child subreaper); a session that stops what it started
passes. Each case is a real pytest session in a subprocess, loading the suite's conftest as a plugin."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

from tests.support import wait_for
from tests.support.inner_session import LEAKY, TIDY, ours, run_session

_session, _ours = run_session, ours


def test_a_process_left_running_fails_the_session_is_named_and_stopped(tmp_path: Path) -> None:
    token = f"leak-{uuid.uuid4().hex[:12]}"
    started = time.monotonic()
    result = _session(tmp_path, LEAKY, token)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "3 passed" in out  # the tests themselves pass: the session fails for what they left
    assert "2 process(es) started by the tests outlived them" in out, out
    lines = {line for line in out.splitlines() if token in line}
    child = [line for line in lines if f"{token}-child" in line]
    daemon = [line for line in lines if f"{token}-daemon" in line]
    # (the test's id is relative to the inner session's root, which differs between pytest versions)
    assert len(child) == 1 and re.search(r"first seen after \S*test_inner\.py::test_forgets_a_child\]", child[0]), out
    assert len(daemon) == 1 and re.search(r"first seen after \S*test_inner\.py::test_starts_a_daemon\]", daemon[0]), out
    assert not [line for line in lines if f"{token}-stopped" in line]
    assert time.monotonic() - started < 60  # stopped by SIGTERM, not waited out
    assert wait_for(lambda: not _ours(token), timeout=10), _ours(token)


def test_a_session_that_stops_what_it_started_passes(tmp_path: Path) -> None:
    token = f"tidy-{uuid.uuid4().hex[:12]}"
    result = _session(tmp_path, TIDY, token)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "outlived" not in out
