"""The exporter as users run it: a subprocess, scraped over HTTP, stopped by signal."""

from __future__ import annotations

import gzip
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import Exporter, child_env, exporter_cmd, http_get, promtool_check, wait_for


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(exporter_cmd(*args), env=env or child_env(), capture_output=True, text=True, timeout=60)


def test_fake_gpus_scraped_over_http(exporter: type[Exporter]) -> None:
    proc = exporter(
        "--gpu-vendor=fake", "--fake.gpus=3", "--fake.mig=2", "--gpu-metrics-collection-interval=200ms"
    ).start()
    page = proc.scrape()
    assert page.count("gpu_up{") == 5  # 3 GPUs + 2 MIG instances
    assert 'mig_profile="1g.10gb"' in page
    assert "gpu_exporter_last_collect_success_timestamp_seconds" in page
    promtool_check(page)
    # the page moves on with each sample
    first = next(line for line in page.splitlines() if line.startswith("gpu_exporter_collects_total"))
    assert wait_for(lambda: first not in proc.scrape(), timeout=5)
    _status, body, headers = http_get(f"http://127.0.0.1:{proc.port}/metrics", {"Accept-Encoding": "gzip"})
    assert headers.get("Content-Encoding") == "gzip" and b"gpu_up" in gzip.decompress(body)
    assert proc.stop(signal.SIGTERM) == 0
    assert "Traceback" not in proc.output()


def test_config_file_env_and_json_logs(exporter: type[Exporter], tmp_path: Path) -> None:
    conf = tmp_path / "exporter.yaml"
    conf.write_text(
        "gpu-vendor: fake\nfake:\n  gpus: 1\nweb:\n  telemetry-path: /gpu\nlog.format: json\n"
        "metrics.include: ^gpu_(up|power_watts)$\n"
    )
    env = child_env(GPU_EXPORTER_CONFIG_FILE=str(conf), GPU_EXPORTER_GPU_METRICS_COLLECTION_INTERVAL="200ms")
    proc = exporter(env=env).start()
    page = proc.scrape("/gpu")
    device_families = {
        line.split("{")[0]
        for line in page.splitlines()
        if line.startswith("gpu_") and not line.startswith("gpu_exporter")
    }
    assert device_families == {"gpu_up", "gpu_power_watts"}
    assert proc.stop() == 0
    first_log = proc.output().splitlines()[0]
    assert first_log.startswith("{") and '"level": "info"' in first_log


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (("--gpu-vendor=fake", "--gpu-metrics-collection-interval=fast"), 2, "invalid duration 'fast'"),
        (("--gpu-vendor=quantum",), 2, "invalid choice 'quantum'"),
        (("--gpu-vendor=nvidia",), 1, "libnvidia-ml.so.1 not found"),
        (("--gpu-vendor=auto",), 1, "--gpu-vendor=fake"),
        (("--gpu-vendor=fake", "--web.listen-address=nohost"), 2, "invalid listen address"),
        (("--no-such-flag",), 2, "unrecognized argument --no-such-flag"),
    ],
)
def test_user_errors_are_one_line_and_nonzero(args: tuple[str, ...], code: int, needle: str) -> None:
    result = run_cli(*args)
    assert result.returncode == code, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert len([line for line in result.stderr.splitlines() if line.startswith("gpu-exporter:")]) == 1


def test_invalid_yaml_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.yaml"
    conf.write_text("gpu-vendor: fake\nfake.gpus: [2\n")
    result = run_cli(f"--config.file={conf}")
    assert result.returncode == 2
    assert f"invalid YAML in {conf}:" in result.stderr
    assert result.stderr.count("\n") == 1


def test_port_in_use_is_one_line() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("--gpu-vendor=fake", f"--web.listen-address=127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_version_and_help() -> None:
    assert run_cli("--version").stdout.startswith("gpu-exporter, version ")
    text = run_cli("--help").stdout
    for flag in (
        "--gpu-metrics-collection-interval",
        "--metrics-buffer-size",
        "--no-collector.gpm",
        "--metrics.include",
        "GPU_EXPORTER_WEB_LISTEN_ADDRESS",
    ):
        assert flag in text


def test_the_malloc_arena_limit_defers_to_malloc_arena_max_and_takes_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    import platform

    from gpu_exporter import daemon

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert not daemon.limit_malloc_arenas()  # the user's setting rules: glibc read it at start
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        env = {k: v for k, v in child_env().items() if k != "MALLOC_ARENA_MAX"}
        code = "from gpu_exporter import daemon; raise SystemExit(0 if daemon.limit_malloc_arenas() else 1)"
        assert subprocess.run([sys.executable, "-c", code], env=env, timeout=30).returncode == 0  # mallopt took
