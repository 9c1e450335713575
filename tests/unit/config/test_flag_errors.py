"""A usage error is one line and exit 2 in every command, naming the closest flag; a flag is taken only as
written (a prefix of one is an error, not the flag: ``--fake.gpu=3`` must not run as ``--fake.gpus=3``)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import child_env, exporter_cmd


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(exporter_cmd(*args), env=child_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("--gpu-vendor=fake", "--fake.gpu=3"),
            "gpu-exporter: unrecognized argument --fake.gpu=3 (did you mean --fake.gpus?)",
        ),
        (
            ("--web.listen=:9400",),
            "gpu-exporter: unrecognized argument --web.listen=:9400 (did you mean --web.listen-address?)",
        ),
        (
            ("--no-collector.gmp",),
            "gpu-exporter: unrecognized argument --no-collector.gmp (did you mean --no-collector.gpm?)",
        ),
        (("brige",), "gpu-exporter: unrecognized argument brige (did you mean bridge?)"),
        (("--zzz",), "gpu-exporter: unrecognized argument --zzz"),
        (
            ("bridge", "--mqtt.ur=mqtt://127.0.0.1"),
            "gpu-exporter bridge: unrecognized argument --mqtt.ur=mqtt://127.0.0.1 (did you mean --mqtt.url?)",
        ),
        (("tail", "--cout=3"), "gpu-exporter tail: unrecognized argument --cout=3 (did you mean --count?)"),
        (
            ("doctor", "--outpt=json"),
            "gpu-exporter doctor: unrecognized argument --outpt=json (did you mean --output?)",
        ),
        (("doctor", "--output=xml"), "gpu-exporter doctor: argument --output: invalid choice: 'xml' (choose from "),
        (("tail", "--count"), "gpu-exporter tail: argument --count: expected one argument"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(args: tuple[str, ...], line: str) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr  # (how argparse lists choices varies)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ("--gpu-vendor=fake", "--fake.gpu=3"),  # --fake.gpus
        ("--gpu-vendor=fake", "--metrics-buffer=9"),  # --metrics-buffer-size
        ("bridge", "--remote-write.ur=http://127.0.0.1:9/api/v1/write"),
        ("tail", "--mqtt.url=mqtt://127.0.0.1:1", "--coun=1"),
        ("doctor", "--out=json"),
    ],
)
def test_a_prefix_of_a_flag_is_not_the_flag(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert "unrecognized argument" in result.stderr and len(result.stderr.splitlines()) == 1


def test_tail_help_names_its_broker_as_the_one_it_reads() -> None:
    for command in ("tail", "bridge"):
        text = " ".join(run(command, "--help").stdout.split())
        assert "forward batches to" not in text and "off when empty" not in text
        assert "--mqtt.url URL MQTT broker the edge nodes publish their batches to" in text
