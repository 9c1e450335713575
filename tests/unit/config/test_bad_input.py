"""Bad input never wins: each case found by trying it ends in one line and exit 2, quickly and small.

The config loader bounds size, depth and aliases; every option has bounds; SIGHUP never ends the
process silently.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpu_exporter import config as cfg
from tests.support import free_port, lone_bridge_args, spawn_logged, stop_process, wait_until
from tests.support.agent_proc import FAST, Proc
from tests.support.procs import one_line_exit_2, run_cli


def test_binary_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "binary.yaml"
    conf.write_bytes(bytes(range(256)) * 8)
    assert "not UTF-8 text" in one_line_exit_2(run_cli(f"--config.file={conf}"))


def test_deeply_nested_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "deep.yaml"
    conf.write_text("[" * 5000 + "]" * 5000 + "\n")
    assert "nested deeper than" in one_line_exit_2(run_cli(f"--config.file={conf}"))


def test_alias_bomb_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "bomb.yaml"
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for n in range(1, 12):
        prev = chr(ord("a") + n - 1)
        name = chr(ord("a") + n)
        lines.append(f"{name}: &{name} [{','.join([f'*{prev}'] * 10)}]")
    conf.write_text("\n".join(lines) + "\n")
    assert "anchors and aliases" in one_line_exit_2(run_cli(f"--config.file={conf}"))


def test_a_pipe_as_config_file_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    assert "pipe" in one_line_exit_2(run_cli(f"--config.file={fifo}"))


def test_dev_zero_as_config_file() -> None:
    assert "larger than" in one_line_exit_2(run_cli("--config.file=/dev/zero"))


@pytest.mark.parametrize(
    "flag",
    [
        "--gpu-metrics-collection-interval=99999999999999d",
        "--metrics-buffer-size=1e20",
        "--metrics-buffer-size=100000000000000000000",
        "--spool.max-age=99999999999999d",
        "--mqtt.batch-max-bytes=" + "9" * 400,
        "--web.max-connections=100000000",
        "--web.read-timeout=99999999999d",
        "--k8s.refresh-interval=99999999999999d",
        "--k8s.idle-power=1e308",
        "--fake.gpus=100000",
    ],
)
def test_absurd_agent_values(flag: str) -> None:
    one_line_exit_2(run_cli("--gpu-vendor=fake", flag))


@pytest.mark.parametrize(
    "flag",
    [
        "--bridge.session-expiry=100000d",
        "--remote-write.timeout=99999999999d",
        "--remote-write.max-backoff=99999999999d",
        "--bridge.max-payload=1e20",
        "--bridge.max-payload=999999TiB",
        "--bridge.max-inflight=1000000",
    ],
)
def test_absurd_bridge_values(flag: str) -> None:
    result = run_cli(
        "--mqtt.url=mqtt://127.0.0.1:1", "--remote-write.url=http://127.0.0.1:1/api/v1/write", flag, command=("bridge",)
    )
    one_line_exit_2(result)


_ABSURD = {
    "DURATION": "99999999999999d",
    "N": "100000000000000000000",
    "SIZE": "9" * 400 + "TiB",
    "PER_SECOND": "1e300",
    "WATTS": "1e300",
}


@pytest.mark.parametrize("opt", [o for o in cfg.OPTIONS if o.metavar in _ABSURD], ids=lambda o: o.name)
def test_every_numeric_option_is_bounded(opt: cfg.Option) -> None:
    """A new option without a ceiling fails here: each numeric option refuses an absurd value."""
    with pytest.raises(cfg.ConfigError, match=f"--{opt.name}"):
        cfg.load({opt.name: _ABSURD[str(opt.metavar)]}, environ={})


def test_sighup_reloads_instead_of_ending_the_agent(tmp_path: Path) -> None:
    proc = Proc(tmp_path, *FAST).start()
    try:
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGHUP)
        from tests.support.mosquitto import wait_until

        assert wait_until(lambda: "reloaded the configuration" in proc.log(), 10), proc.log()
        assert proc.proc.poll() is None
        assert "gpu_power_watts" in proc.scrape()
    finally:
        assert proc.stop() == 0


def test_sighup_does_not_end_the_bridge(tmp_path: Path) -> None:
    log_path = tmp_path / "bridge.log"
    bridge = spawn_logged(log_path, *lone_bridge_args(free_port()))
    try:
        assert wait_until(lambda: "bridge" in log_path.read_text() or bridge.poll() is not None, 20)
        assert bridge.poll() is None, log_path.read_text()
        bridge.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "SIGHUP" in log_path.read_text() or bridge.poll() is not None, 10)
        assert bridge.poll() is None, log_path.read_text()
    finally:
        stop_process(bridge, timeout=20)


@pytest.mark.parametrize("value", ["[a, b]", "{a: 1}"])
def test_a_yaml_list_or_mapping_for_a_single_value_option_is_one_line_not_a_silent_regex(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"metrics.include: {value}\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load({"config.file": str(path)}, environ={})
    assert f"{path}:1: --metrics.include takes one value" in str(info.value)
