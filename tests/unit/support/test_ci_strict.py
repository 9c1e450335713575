"""In CI a skip means a tool the run forgot to install: tests/conftest.py turns it into a failure, except
for skips that say the test does not apply to this machine."""

from __future__ import annotations

import pytest

from tests.support import paths

pytest_plugins = ["pytester"]

CONFTEST = (paths.TESTS / "conftest.py").read_text(encoding="utf-8")
LEFTOVERS = (paths.SUPPORT / "leftovers.py").read_text(encoding="utf-8")  # the conftest imports it

TESTS = """
import pytest

def test_tool_missing():
    pytest.skip("promtool is not installed")

def test_machine_differs():
    pytest.skip("not applicable here: this machine has a real driver")

@pytest.mark.xfail(reason="known", strict=False)
def test_expected_failure():
    raise AssertionError
"""

MODULE_SKIP = """
import pytest
pytest.skip("the amdsmi package is not installed", allow_module_level=True)
"""


def _run(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(leftovers=LEFTOVERS, test_tools=TESTS, test_module_skip=MODULE_SKIP)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")


def test_in_ci_a_skip_for_a_missing_tool_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = _run(pytester)
    outcome = result.parseoutcomes()
    assert outcome.get("failed") == 1 and outcome.get("errors", outcome.get("error")) == 1, result.stdout.str()
    assert outcome.get("skipped") == 1 and outcome.get("xfailed") == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*skipped in CI, where it must run: *promtool is not installed*"])


def test_outside_ci_the_same_skips_stay_skips(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = _run(pytester)
    outcome = result.parseoutcomes()
    assert outcome.get("skipped") == 3 and "failed" not in outcome, result.stdout.str()
