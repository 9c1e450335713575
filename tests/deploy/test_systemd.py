"""deploy/systemd/: the unit as systemd itself reads it (``systemd-analyze verify``: every key known and
valid, ``systemd-analyze security``: its exposure), the hardening a host without Kubernetes relies on,
and the shipped configuration file as the agent reads it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpu_exporter import config as cfg
from tests.support import ROOT

UNIT = ROOT / "deploy" / "systemd" / "gpu-exporter.service"
SOCKET = ROOT / "deploy" / "systemd" / "gpu-exporter.socket"
DROP_IN = ROOT / "deploy" / "systemd" / "socket-activation.conf"
CONFIG = ROOT / "deploy" / "systemd" / "config.yaml"
EXEC = "/opt/gpu-exporter/bin/gpu-exporter"


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.fail("systemd-analyze is needed (Debian package systemd)")
    return tool


def _installable(tmp_path: Path, text: str | None = None) -> Path:
    """The unit with its ExecStart pointing at an executable that exists here (verify checks it)."""
    stub = tmp_path / "gpu-exporter"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    unit = tmp_path / "gpu-exporter.service"
    unit.write_text((text if text is not None else UNIT.read_text()).replace(EXEC, str(stub)))
    return unit


def _verify(*units: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_analyze(), "verify", *map(str, units)], capture_output=True, text=True, timeout=120, env=dict(os.environ)
    )


def test_systemd_analyze_verify_finds_nothing(tmp_path: Path) -> None:
    result = _verify(_installable(tmp_path))
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def test_verify_would_see_a_mistake(tmp_path: Path) -> None:
    """verify exits 0 on an unknown key or a bad value: its output is what tells."""
    for old, new in (
        ("ProtectSystem=strict", "ProtectSystm=strict"),
        ("DeviceAllow=/dev/kfd rw", "DeviceAllow=/dev/kfd rwx"),
    ):
        result = _verify(_installable(tmp_path, UNIT.read_text().replace(old, new)))
        assert result.stdout + result.stderr != "", old


def test_exposure_is_low(tmp_path: Path) -> None:
    """systemd's own score of the sandbox, 0 (locked) to 10 (exposed): at most 2.5 ("OK")."""
    result = subprocess.run(
        [_analyze(), "security", "--offline=yes", "--threshold=25", "--no-pager", str(_installable(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr


def _socket_activated(tmp_path: Path, socket_text: str | None = None, drop_in: str | None = None) -> Path:
    """The service, its .socket unit and the drop-in as installed side by side (verify reads the drop-in
    from ``gpu-exporter.service.d/`` beside the service); the socket unit's path."""
    tmp_path.mkdir(exist_ok=True)
    _installable(tmp_path)
    (tmp_path / "gpu-exporter.service.d").mkdir()
    (tmp_path / "gpu-exporter.service.d" / DROP_IN.name).write_text(
        drop_in if drop_in is not None else DROP_IN.read_text()
    )
    unit = tmp_path / SOCKET.name
    unit.write_text(socket_text if socket_text is not None else SOCKET.read_text())
    return unit


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def test_the_socket_unit_and_its_drop_in_verify(tmp_path: Path) -> None:
    socket_unit = _socket_activated(tmp_path)
    result = _verify(socket_unit, tmp_path / "gpu-exporter.service")
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stdout + result.stderr


def test_verify_sees_a_mistake_in_the_socket_unit_or_the_drop_in(tmp_path: Path) -> None:
    bad_socket = _socket_activated(tmp_path / "a", socket_text=SOCKET.read_text().replace("FreeBind=", "FreeBnd="))
    assert "FreeBnd" in _said(_verify(bad_socket, tmp_path / "a" / "gpu-exporter.service"))
    bad_drop_in = DROP_IN.read_text().replace("Requires=", "Requirez=")
    socket_unit = _socket_activated(tmp_path / "b", drop_in=bad_drop_in)
    assert "Requirez" in _said(_verify(socket_unit, tmp_path / "b" / "gpu-exporter.service"))


def _keys(path: Path) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith("#") and not line.startswith("["):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def test_the_drop_in_has_the_service_take_the_socket_it_requires() -> None:
    """The drop-in's environment turns --web.systemd-socket on as the agent reads it, and the socket
    listens on the agent's default port, so a scrape target stays the same with or without activation."""
    drop_in, sock = _keys(DROP_IN), _keys(SOCKET)
    assert drop_in["Requires"] == ["gpu-exporter.socket"] and drop_in["After"] == ["gpu-exporter.socket"]
    environ = dict(value.split("=", 1) for value in drop_in["Environment"])
    assert cfg.load({}, environ={"NODE_NAME": "n", **environ}).web_systemd_socket is True
    assert cfg.load({}, environ={"NODE_NAME": "n"}).web_systemd_socket is False
    assert sock["ListenStream"] == ["9400"] and cfg.Config().listen_address == (":9400",)
    assert sock["WantedBy"] == ["sockets.target"]


def _service() -> dict[str, list[str]]:
    return _keys(UNIT)


def test_the_unit_is_hardened_as_documented() -> None:
    s = _service()
    assert s["ExecStart"] == [f"{EXEC} --config.file=/etc/gpu-exporter/config.yaml"]
    assert s["DynamicUser"] == ["yes"] and s["NoNewPrivileges"] == ["yes"]
    assert s["CapabilityBoundingSet"] == [""] and s["AmbientCapabilities"] == [""]
    assert s["ProtectSystem"] == ["strict"] and s["ProtectHome"] == ["yes"] and s["PrivateTmp"] == ["yes"]
    # the spool is the only writable place, and it is where the agent's default spool.dir is
    assert s["StateDirectory"] == ["gpu-exporter"]
    assert cfg.Config().spool_dir == "/var/lib/gpu-exporter/spool"
    assert s["DevicePolicy"] == ["closed"]
    allowed = {rule.split()[0] for rule in s["DeviceAllow"]}
    assert {"char-nvidia-frontend", "/dev/kfd", "char-drm"} <= allowed
    assert set(s["SupplementaryGroups"][0].split()) == {"video", "render"}
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert s["RestartPreventExitStatus"] == ["2"]  # a usage error is not fixed by restarting


def test_the_shipped_configuration_loads() -> None:
    config = cfg.load({"config.file": str(CONFIG)})
    assert config.log_format == "logfmt" and config.gpu_vendor == "auto"
    assert config.spool_dir == "/var/lib/gpu-exporter/spool"
