"""Each command's --help lists its own options only; every option is declared once (config.OPTIONS)."""

from __future__ import annotations

import re
import subprocess

from gpu_exporter import config as cfg
from tests.support import child_env, exporter_cmd


def flags(*command: str) -> set[str]:
    result = subprocess.run(
        exporter_cmd(*command, "--help"), env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return set(re.findall(r"^\s+(--[a-z][a-z0-9.\-]*)", result.stdout, re.MULTILINE))


def test_agent_help_lists_no_bridge_option() -> None:
    agent = flags()
    assert "--gpu-vendor" in agent and "--web.config.file" in agent and "--spool.dir" in agent
    assert not {f for f in agent if f.startswith(("--bridge.", "--remote-write."))}
    doctor = flags("doctor")
    assert "--gpu-vendor" in doctor and "--output" in doctor
    assert not {f for f in doctor if f.startswith(("--bridge.", "--remote-write."))}


def test_bridge_and_tail_help_list_no_agent_option() -> None:
    bridge = flags("bridge")
    assert "--remote-write.url" in bridge and "--mqtt.url" in bridge and "--web.config.file" in bridge
    for agent_only in ("--gpu-vendor", "--spool.dir", "--metrics-buffer-size", "--k8s.pod-attribution"):
        assert agent_only not in bridge
    tail = flags("tail")
    assert "--mqtt.url" in tail
    assert not {f for f in tail if f.startswith(("--bridge.", "--remote-write.", "--gpu-", "--spool.", "--web."))}


def test_every_option_is_in_some_command_and_declared_once() -> None:
    names = [o.name for o in cfg.OPTIONS]
    assert len(names) == len(set(names))
    everywhere = flags() | flags("bridge") | flags("tail")
    assert {f"--{n}" for n in names} <= everywhere


def test_the_bridge_takes_its_mqtt_keepalive_from_the_option() -> None:
    from gpu_exporter.bridge.cli import settings_from

    args = {"mqtt.url": "mqtt://127.0.0.1:1883", "remote-write.url": "http://127.0.0.1:9/api/v1/write"}
    assert settings_from(cfg.load(args, {})).keepalive == 30
    assert settings_from(cfg.load({**args, "mqtt.keepalive": "45s"}, {})).keepalive == 45
    assert "--mqtt.keepalive" in flags("bridge")


def test_the_bridge_shows_duration_defaults_as_they_are_written() -> None:
    """The bridge's --help declares its options through the agent's one function: a duration's default
    reads as an option value (``30s``), not as seconds in a float (``30.0``)."""
    result = subprocess.run(
        exporter_cmd("bridge", "--help"), env=child_env(), capture_output=True, text=True, timeout=60
    )
    text = " ".join(result.stdout.split())
    assert "MQTT keepalive (default: 30s)" in text, text
    assert not re.search(r"\(default: \d+\.\d+\)", text.split("--bridge.write-linger", 1)[1][:200])
