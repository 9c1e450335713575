"""Shared test helpers: free ports, promtool, and the exporter as a real subprocess."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

try:
    from .support import leftovers
except ImportError:  # a copy loaded outside the tests package (tests/unit/support/test_ci_strict.py runs one)
    import leftovers  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent  # (not support.paths: a copy runs outside the package)
SRC = ROOT / "src"

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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def exporter_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_exporter", *args]


def http_get(
    url: str, headers: dict[str, str] | None = None, timeout: float = 5.0
) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy or ``timeout`` passes (then return it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, step: float = 0.05) -> bool:
    return bool(wait_until(predicate, timeout, step))


def wait_progressing(
    done: Callable[[], Any], progress: Callable[[], Any], stall: float, what: str, interval: float = 0.5
) -> Any:
    """Poll ``done`` until it returns something truthy (then return it), for as long as the work moves.

    For work whose amount is fixed but whose speed is the machine's (a flood the bridge must decode):
    on a loaded machine it takes longer, so there is no deadline; it fails when ``progress()`` (a
    reading of the work, such as messages received and samples written) has not changed for ``stall``
    seconds, which is a hang, not load. The test's own timeout stays the last guard."""

    def reading(check: Callable[[], Any]) -> Any:
        try:
            return check()
        except OSError:  # an endpoint too busy to answer in time: not done, no progress seen
            return None

    last = reading(progress)
    moved = time.monotonic()
    while True:
        value = reading(done)
        if value:
            return value
        now = reading(progress)
        if now is not None and now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall:
            raise AssertionError(f"no progress for {stall:g}s waiting for {what} (still at {last!r})")
        time.sleep(interval)


def stop_process(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Signal a child by its PID and wait; SIGKILL when it outlives ``timeout``. Its exit status."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    return int(proc.returncode)


def lone_bridge_args(port: int) -> list[str]:
    """``bridge`` serving its endpoint on ``port``, its broker and remote write unreachable (port 1)."""
    return [
        "bridge",
        "--mqtt.url=mqtt://127.0.0.1:1",
        "--remote-write.url=http://127.0.0.1:1/api/v1/write",
        f"--bridge.listen-address=127.0.0.1:{port}",
    ]


def spawn_logged(log_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``gpu-exporter ARGS`` as a child whose output goes to ``log_path`` (readable while it runs)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(exporter_cmd(*args), env=child_env(), stdout=log, stderr=log)


class Exporter:
    """The exporter CLI as a child process, stopped by PID."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.args = ["--web.listen-address", f"127.0.0.1:{self.port}", *args]
        self.env = env or child_env()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Exporter:
        self.proc = subprocess.Popen(
            exporter_cmd(*self.args), env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        url = f"http://127.0.0.1:{self.port}/readyz"
        if not wait_for(lambda: self._ready(url), timeout=20):
            self.stop()
            raise AssertionError(f"exporter did not become ready: {self.output()}")
        return self

    def _ready(self, url: str) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"exporter exited early: {self.output()}")
        try:
            return http_get(url, timeout=1)[0] == 200
        except OSError:
            return False

    def scrape(self, path: str = "/metrics") -> str:
        status, body, _ = http_get(f"http://127.0.0.1:{self.port}{path}")
        assert status == 200, body
        return body.decode()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        return stop_process(self.proc, sig, timeout)

    def output(self) -> str:
        if self.proc is None or self.proc.stdout is None:
            return ""
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stdout.read().decode(errors="replace")


@pytest.fixture
def exporter() -> Iterator[type[Exporter]]:
    started: list[Exporter] = []

    class Tracked(Exporter):
        def start(self) -> Exporter:
            started.append(self)
            return super().start()

    yield Tracked
    for proc in started:
        if proc.proc is not None and proc.proc.poll() is None:
            proc.stop(signal.SIGKILL)


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
