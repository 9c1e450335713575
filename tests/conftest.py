"""The suite's hooks: no quiet skips in CI, integration tests first, no process outliving the session;
and the `exporter` fixture. Helpers live in tests/support/."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .support.procs import Exporter

try:
    from .support import leftovers
except ImportError:  # a copy outside the tests package, leftovers.py beside it (tests/unit/support/test_ci_strict.py)
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location("leftovers", Path(__file__).with_name("leftovers.py"))
    assert _spec is not None and _spec.loader is not None
    leftovers = sys.modules["leftovers"] = importlib.util.module_from_spec(_spec)  # type: ignore[assignment]
    _spec.loader.exec_module(leftovers)  # (its dataclasses look their module up in sys.modules)

# A skip whose reason starts with this describes the machine, not a missing tool: the test cannot apply
# here (a real GPU driver is installed, ROCm is installed). Every other skip is a failure in CI, so that
# a tool CI forgot to install shows as red instead of as a quiet "s". docs/testing.md lists these.
NOT_APPLICABLE = "not applicable here:"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_hidden_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not (report.skipped and _in_ci()) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if reason.removeprefix("Skipped: ").startswith(NOT_APPLICABLE):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped in CI, where it must run: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    _fail_hidden_skip(outcome.get_result())


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    _fail_hidden_skip(report)


@pytest.hookimpl(trylast=True)  # after pytest grouped the tests that share a module-scoped fixture
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The integration tests first, in their order, then the rest in theirs: under pytest-xdist the
    long tests (real brokers and databases, up to a minute or two each) start at once, and the short
    ones fill the workers' gaps, instead of a minute-long test starting last and running alone."""
    items.sort(key=lambda item: item.get_closest_marker("integration") is None)


# --- No process outlives the suite (tests/support/leftovers.py, docs/testing.md) ---------------------------------
_FIRST_SEEN: dict[int, str] = {}  # PID -> the test after which it was first seen running
_GRACE = 3.0  # seconds a process signalled by the last test's teardown may take to exit


def pytest_sessionstart(session: pytest.Session) -> None:
    leftovers.become_subreaper()
    for proc in leftovers.descendants():
        _FIRST_SEEN.setdefault(proc.pid, "(before the first test)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    for proc in leftovers.descendants():
        if proc.state != "Z":
            _FIRST_SEEN.setdefault(proc.pid, item.nodeid)


_FROM_WORKERS: list[str] = []  # under pytest-xdist, in the controller: what each worker reported


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist's controller: a worker finished; keep the processes its own check found."""
    found = getattr(node, "workeroutput", {}).get("leftovers", [])
    _FROM_WORKERS.extend(f"{line}  [worker {node.gateway.id}]" for line in found)


@pytest.hookimpl(trylast=True)  # under pytest-xdist: after the controller has stopped its workers
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a process it started is still running, naming each and the test after
    which it was first seen; then stop them all by PID, so that nothing leaks either way. Under
    pytest-xdist each worker checks its own descendants and hands what it found to the controller,
    which reports them all."""
    left: list[leftovers.Proc] = []
    deadline = time.monotonic() + _GRACE
    while True:
        found = leftovers.descendants()
        leftovers.reap_zombies(found)
        left = [p for p in found if p.state != "Z"]
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    found_here = [f"  {proc}  [first seen after {_FIRST_SEEN.get(proc.pid, 'the last test')}]" for proc in left]
    if left:
        leftovers.stop_descendants()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its controller reports and fails the session
        workeroutput["leftovers"] = found_here
        return
    found_here += _FROM_WORKERS
    if not found_here:
        return
    lines = [f"{len(found_here)} process(es) started by the tests outlived them (stopped now):", *found_here]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
        for line in lines:
            reporter.write_line(line, red=True, bold=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def exporter() -> Iterator[type[Exporter]]:
    """The Exporter class, its instances stopped (SIGKILL) when the test ends if still running."""
    from .support.procs import Exporter  # here: a copy of this file runs outside the package (test_ci_strict)

    started: list[Exporter] = []

    class Tracked(Exporter):
        def start(self) -> Exporter:
            started.append(self)
            return super().start()

    yield Tracked
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop(signal.SIGKILL)
