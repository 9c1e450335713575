"""Every identity-like option is bounded at start: one clear line and exit 2, never a connection that
fails every turn with a traceback (a 70,000-character client id or user name used to pass the start)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.mqtt.settings import read_password_bytes
from tests.support import child_env, exporter_cmd

FORWARD = ["--gpu-vendor=fake", "--mqtt.url=mqtt://127.0.0.1:1"]


def _start(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(exporter_cmd(*args), env=child_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--mqtt.client-id=" + "c" * 70_000, "--mqtt.client-id: 70000 bytes long, at most 256"),
        ("--mqtt.client-id=" + "é" * 129, "--mqtt.client-id: 258 bytes long, at most 256"),
        ("--mqtt.client-id=agent\x01one", "--mqtt.client-id: contains control characters"),
        ("--mqtt.username=" + "u" * 70_000, "--mqtt.username: 70000 bytes long, at most 1024"),
        ("--mqtt.username=edge\x1b", "--mqtt.username: contains control characters"),
        ("--mqtt.topic-prefix=" + "p" * 300, "--mqtt.topic-prefix: 300 bytes long, at most 256"),
        ("--node-name=" + "n" * 70_000, "--node-name: 70000 bytes long, at most 253"),
    ],
)
def test_an_identity_option_past_its_bound_is_one_line_and_exit_2(flag: str, expected: str) -> None:
    result = _start(*FORWARD, flag)
    assert result.returncode == 2, result.stderr[-500:]
    assert expected in result.stderr and result.stderr.count("\n") == 1, result.stderr[-500:]


@pytest.mark.parametrize(
    ("name", "expected"), [("n" * 300, "--node-name: 300 bytes long, at most 253"), ("edge\x1b1", "control characters")]
)
def test_the_node_name_is_bounded_without_forwarding_too(name: str, expected: str) -> None:
    """It is a label value on the page (the DCGM view's hostname); only forwarding makes it a topic level."""
    result = _start("--gpu-vendor=fake", "--node-name=" + name)
    assert result.returncode == 2 and expected in result.stderr, result.stderr[-300:]
    assert result.stderr.count("\n") == 1


def test_a_password_file_whose_first_line_is_over_mqtts_limit_is_refused_at_start(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_bytes(b"p" * 70_000 + b"\n")
    result = _start(*FORWARD, "--mqtt.username=edge", f"--mqtt.password-file={password}")
    assert result.returncode == 2
    assert "its first line is over 65535 bytes" in result.stderr and result.stderr.count("\n") == 1


def test_a_password_file_rotated_to_something_huge_is_not_read_whole(tmp_path: Path) -> None:
    """Re-read at every connection: a file that became a 100 MB blob without a newline is one error."""
    password = tmp_path / "password"
    with open(password, "wb") as handle:
        handle.truncate(100 * 1024 * 1024)
    with pytest.raises(OSError, match="over 65535 bytes"):
        read_password_bytes(str(password))
    password.write_bytes(b"s3cret\nsecond line\n")
    assert read_password_bytes(str(password)) == b"s3cret"


def test_bounds_leave_ordinary_identities_alone(tmp_path: Path) -> None:
    """A 253-byte node name gives a 266-byte default client id: derived from a valid name, it is taken."""
    from gpu_exporter import config as cfg

    config = cfg.load(
        {
            "gpu-vendor": "fake",
            "mqtt.url": "mqtt://127.0.0.1:1",
            "node-name": "n" * 253,
            "mqtt.username": "HUB.azure-devices.net/edge-07/?api-version=2021-04-12",
            "mqtt.client-id": "c" * 256,
        },
        environ={},
    )
    assert config.mqtt_client_id == "c" * 256


FORWARDING = {"mqtt.url": "mqtt://127.0.0.1:1"}


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("mqtt.client-id", "agent\x7fone", "contains control characters ('\\x7f')"),  # DEL
        ("mqtt.username", "edge\x85user", "contains control characters ('\\x85')"),  # C1: NEL, from a paste
        ("mqtt.client-id", "é" * 129, "258 bytes long, at most 256"),  # bytes of UTF-8, not characters
        ("mqtt.username", "ü" * 513, "1026 bytes long, at most 1024"),
    ],
)
def test_identity_options_are_bounded_in_bytes_and_refuse_every_control_character(
    name: str, text: str, expected: str
) -> None:
    """The loader's own check, as every entry point (flags, environment, config file) reaches it."""
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load({**FORWARDING, name: text}, environ={})
    assert str(info.value) == f"--{name}: {expected}"


def test_identities_at_their_bounds_in_any_script_are_accepted() -> None:
    config = cfg.load({**FORWARDING, "mqtt.client-id": "é" * 128, "mqtt.username": "节" * 341}, environ={})
    assert (len(config.mqtt_client_id.encode()), len(config.mqtt_username.encode())) == (256, 1023)
