"""Inner pytest sessions for the tests of the session-end check (tests/unit/support/test_leftovers*.py):
test files that leave processes behind, or do not, run in a child pytest with the suite's conftest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import leftovers
from .paths import ROOT

LEAKY = """
import subprocess, sys

def test_starts_and_stops():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "TOKEN-stopped"])
    proc.terminate()
    proc.wait(10)

def test_forgets_a_child():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "TOKEN-child"])

def test_starts_a_daemon():
    # the shell exits at once: its background child is an orphan, re-parented away from the shell
    subprocess.run(["sh", "-c", sys.executable + " -c 'import time; time.sleep(300)' TOKEN-daemon & exit 0"], check=True)
"""

TIDY = """
import subprocess, sys

def test_starts_and_stops():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "TOKEN-stopped"])
    proc.terminate()
    proc.wait(10)
"""


def run_session(tmp_path: Path, source: str, token: str, workers: int = 0) -> subprocess.CompletedProcess[str]:
    """A pytest session in a child process, running ``source`` (TOKEN replaced by ``token``) as
    test_inner.py under ``tmp_path`` with the suite's conftest as its only plugin (and pytest-xdist's with
    ``workers``); its test ids are relative to ``tmp_path``."""
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(source.replace("TOKEN", token), encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "tests.conftest",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(tmp_path),
    ]
    if workers:
        cmd += ["-p", "xdist.plugin", "-n", str(workers)]
    cmd.append(str(test_file))
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # the suite's conftest alone: a quick start
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def ours(token: str) -> list[leftovers.Proc]:
    """This session's descendants whose command line carries ``token`` (an inner session's orphans are
    re-parented here: this session is a subreaper too)."""
    return [p for p in leftovers.descendants() if token in p.cmdline and p.state != "Z"]
