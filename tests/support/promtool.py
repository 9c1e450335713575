"""promtool's own check of an exposition page."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def promtool_path() -> str | None:
    found = shutil.which("promtool")
    if found is None and os.environ.get("CI"):
        pytest.fail("promtool is required in CI (Debian package prometheus)")
    return found


def promtool_check(text: str) -> None:
    """Fails the test if promtool finds a problem with the exposition text."""
    tool = promtool_path()
    if tool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    result = subprocess.run([tool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    problems = (result.stdout + result.stderr).decode()
    assert result.returncode == 0 and not problems.strip(), problems
