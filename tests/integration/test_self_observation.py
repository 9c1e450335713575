"""The agent and the bridge watched by their own Prometheus: process_*, build_info with the revision,
``--version`` with revision and build date, logfmt and JSON logs."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from gpu_exporter import buildinfo
from gpu_exporter.logs import JsonFormatter, LogfmtFormatter
from tests.support import ROOT, SRC, Exporter, child_env, exporter_cmd, free_port, http_get, lone_bridge_args, wait_for

LOGFMT_LINE = re.compile(
    r"^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(debug|info|warn|error) caller=\S+:\d+ msg="
)


def _head() -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _series(page: str, name: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith(name + "{") or line.startswith(name + " ")]


# --- build info -----------------------------------------------------------------------------------


def _copy_package(tmp_path: Path, build_json: str | None) -> Path:
    """The package as pip installs it: outside any git checkout, with or without the build's file."""
    target = tmp_path / "site"
    shutil.copytree(SRC / "gpu_exporter", target / "gpu_exporter", ignore=shutil.ignore_patterns("__pycache__"))
    stale = target / "gpu_exporter" / "_build.json"
    stale.unlink(missing_ok=True)
    if build_json is not None:
        stale.write_text(build_json)
    return target


def _version_of(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env()
    env["PYTHONPATH"] = str(site)
    return subprocess.run(
        [sys.executable, "-m", "gpu_exporter", *args, "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=site,
    )


def test_version_names_the_checkouts_revision() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not applicable here: not a git checkout")
    for command in ([], ["bridge"], ["doctor"]):
        result = subprocess.run(exporter_cmd(*command, "--version"), env=child_env(), capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        first = result.stdout.splitlines()[0]
        prog = " ".join(["gpu-exporter", *command])
        assert first == f"{prog}, version {buildinfo.__version__} (revision: {_head()})"
        assert "build date:" in result.stdout and f"python version: {sys.version.split()[0]}" in result.stdout


def test_version_from_the_file_written_at_build_time(tmp_path: Path) -> None:
    site = _copy_package(tmp_path, '{"revision": "0123abcd", "build_date": "2025-05-20T10:00:00Z"}\n')
    result = _version_of(site)
    assert result.returncode == 0, result.stderr
    assert "(revision: 0123abcd)" in result.stdout and "build date:     2025-05-20T10:00:00Z" in result.stdout


@pytest.mark.parametrize("content", [None, "", "{not json", '["a list"]', '{"revision": 7}'])
def test_version_is_unknown_not_a_crash_without_build_metadata(tmp_path: Path, content: str | None) -> None:
    result = _version_of(_copy_package(tmp_path, content))
    assert result.returncode == 0, result.stderr
    assert "(revision: unknown)" in result.stdout and "build date:     unknown" in result.stdout


def test_git_revision_is_unknown_outside_a_checkout_or_without_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert buildinfo.git_revision(tmp_path) == "unknown"
    (tmp_path / ".git").mkdir()  # a checkout, but git cannot read it
    assert buildinfo.git_revision(tmp_path) == "unknown"
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert buildinfo.git_revision(ROOT) == "unknown"


# --- process_* and build_info on /metrics ---------------------------------------------------------


@pytest.mark.integration
def test_agent_serves_process_metrics_and_build_info(exporter: type[Exporter]) -> None:
    started = time.time()
    proc = exporter("--gpu-vendor=fake", "--fake.gpus=1", "--gpu-metrics-collection-interval=200ms").start()
    try:
        page = ""

        def has_process() -> bool:
            nonlocal page
            page = http_get(f"http://127.0.0.1:{proc.port}/metrics")[1].decode()
            return bool(_series(page, "process_resident_memory_bytes"))

        assert wait_for(has_process, timeout=10), page
        rss = float(_series(page, "process_resident_memory_bytes")[0].split()[-1])
        assert 5 * 2**20 < rss < 500 * 2**20
        start = float(_series(page, "process_start_time_seconds")[0].split()[-1])
        assert started - 60 < start < time.time() + 1
        assert float(_series(page, "process_cpu_seconds_total")[0].split()[-1]) > 0
        assert float(_series(page, "process_open_fds")[0].split()[-1]) >= 3
        assert _series(page, "process_max_fds")
        build = _series(page, "gpu_exporter_build_info")
        assert len(build) == 1 and 'revision="' in build[0] and f'version="{buildinfo.__version__}"' in build[0]
        if (ROOT / ".git").exists():
            assert f'revision="{_head()}"' in build[0]
    finally:
        proc.stop()


@pytest.mark.integration
def test_bridge_serves_process_metrics_and_build_info() -> None:
    port = free_port()
    proc = subprocess.Popen(
        exporter_cmd(*lone_bridge_args(port)), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        page = ""

        def served() -> bool:
            nonlocal page
            try:
                page = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
            except OSError:
                return False
            return "process_resident_memory_bytes" in page

        assert wait_for(served, timeout=20), page
        for name in ("process_cpu_seconds_total", "process_open_fds", "process_start_time_seconds"):
            assert _series(page, name), name
        build = _series(page, "gpu_exporter_bridge_build_info")
        assert len(build) == 1 and 'revision="' in build[0] and build[0].endswith(" 1.0")
    finally:
        proc.terminate()
        proc.wait(10)


# --- logs -----------------------------------------------------------------------------------------


def _record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord(
        "gpu_exporter.x", logging.WARNING, str(SRC / "gpu_exporter" / "forward" / "mqtt.py"), 42, msg, args, None
    )
    record.__dict__.update(extra)
    return record


def test_logfmt_line_layout_and_quoting() -> None:
    line = LogfmtFormatter().format(_record('broker %s said "no"\nbye', "b:1883", node="edge 7", attempt=3))
    assert LOGFMT_LINE.match(line), line
    assert " level=warn caller=forward/mqtt.py:42 " in line
    assert line.endswith(' msg="broker b:1883 said \\"no\\"\\nbye" node="edge 7" attempt=3')
    assert "\n" not in line


def test_logfmt_carries_a_traceback_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record("failed")
        record.exc_info = sys.exc_info()
    line = LogfmtFormatter().format(record)
    assert "\n" not in line and 'err="Traceback' in line and "ValueError: boom" in line


def test_json_lines_have_the_same_keys() -> None:
    entry = json.loads(JsonFormatter().format(_record("hello %d", 5, node="edge-7")))
    assert entry["level"] == "warn" and entry["msg"] == "hello 5" and entry["caller"] == "forward/mqtt.py:42"
    assert entry["node"] == "edge-7" and entry["ts"].endswith("Z")


@pytest.mark.integration
@pytest.mark.parametrize("flag", [[], ["--log.format=logfmt"], ["--log.format=text"]])
def test_agent_logs_logfmt_by_default(exporter: type[Exporter], flag: list[str]) -> None:
    proc = exporter("--gpu-vendor=fake", "--fake.gpus=1", *flag).start()
    proc.stop()
    lines = [line for line in proc.output().splitlines() if line]
    assert lines and all(LOGFMT_LINE.match(line) for line in lines), lines
    assert any('msg="serving /metrics on' in line for line in lines)


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_bridge_logs_in_the_format_asked(fmt: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        exporter_cmd(*lone_bridge_args(port), f"--log.format={fmt}"),
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_for(lambda: _listening(port), timeout=20)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    lines = [line for line in out.splitlines() if line]
    assert lines
    for line in lines:
        if fmt == "json":
            assert json.loads(line)["level"] in ("debug", "info", "warn", "error")
        else:
            assert LOGFMT_LINE.match(line), line


def _listening(port: int) -> bool:
    try:
        return http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    except OSError:
        return False


def test_an_unknown_log_format_is_one_line_and_exit_2() -> None:
    result = subprocess.run(
        exporter_cmd("--log.format=xml"), env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "gpu-exporter: flag --log.format: invalid choice 'xml' (choose from logfmt, json, text)"
    ]


def test_a_build_records_the_revision(tmp_path: Path) -> None:
    """setup.py's build_py hook writes _build.json from git into what `pip wheel .` (and so `pip install .`)
    builds, with the setuptools pyproject.toml asks for in pip's isolated build environment."""
    if not (ROOT / ".git").exists():
        pytest.skip("not applicable here: not a git checkout")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-cache-dir",
            f"--wheel-dir={tmp_path}",
            str(ROOT),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(child_env(), SOURCE_DATE_EPOCH="1747735200"),
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("gpu_exporter-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    written = json.loads((site / "gpu_exporter" / "_build.json").read_text())
    assert written == {"revision": _head(), "build_date": "2025-05-20T10:00:00Z"}
    version = _version_of(site)
    assert f"(revision: {_head()})" in version.stdout and "2025-05-20T10:00:00Z" in version.stdout
