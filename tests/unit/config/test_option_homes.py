"""Options live next to the code they configure: each section's module holds its dataclass and its rows,
any of them can be imported first, and none costs a start the libraries of the daemons."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.agent_options import AGENT_OPTIONS, SAMPLING_OPTIONS, AgentOptions, SamplingOptions
from gpu_exporter.backends.options import BACKEND_OPTIONS, BackendOptions
from gpu_exporter.bridge.options import BRIDGE_OPTIONS, REMOTE_WRITE_OPTIONS, BridgeOptions, RemoteWriteOptions
from gpu_exporter.config import commands
from gpu_exporter.forward.options import FORWARD_OPTIONS, ForwardOptions
from gpu_exporter.k8s.options import K8S_OPTIONS, K8sOptions
from gpu_exporter.web.options import WEB_OPTIONS, WebOptions
from tests.support import child_env

SECTIONS = [
    (SamplingOptions, SAMPLING_OPTIONS),
    (WebOptions, WEB_OPTIONS),
    (AgentOptions, AGENT_OPTIONS),
    (BackendOptions, BACKEND_OPTIONS),
    (ForwardOptions, FORWARD_OPTIONS),
    (BridgeOptions, BRIDGE_OPTIONS),
    (RemoteWriteOptions, REMOTE_WRITE_OPTIONS),
    (K8sOptions, K8S_OPTIONS),
]
# --config.file and the collector switches fill them (--collector.disable-defaults is listed with the switches)
NOT_OPTIONS = {"config_file", "disabled_collectors", "enabled_collectors", "collector_disable_defaults"}

MODULES = [
    "gpu_exporter.agent_options",
    "gpu_exporter.backends.options",
    "gpu_exporter.web.options",
    "gpu_exporter.forward.options",
    "gpu_exporter.bridge.options",
    "gpu_exporter.k8s.options",
    "gpu_exporter.config.commands",
]
# What only a daemon's work needs; reading the options must not load it.
HEAVY = ("paho", "google", "prometheus_client", "pynvml", "amdsmi", "yaml", "gpu_exporter.k8s.attribution")


@pytest.mark.parametrize(("section", "rows"), SECTIONS, ids=lambda s: getattr(s, "__name__", ""))
def test_each_section_declares_the_rows_of_its_own_fields(section: type, rows: tuple[cfg.Option, ...]) -> None:
    own = {f.name for f in dataclasses.fields(section)}
    assert [o.field for o in rows if o.field not in own] == []
    assert own - NOT_OPTIONS - {o.field for o in rows} == set()


def test_config_is_the_sections_and_the_table_their_rows() -> None:
    assert [f.name for f in dataclasses.fields(cfg.Config)] == [
        f.name for section, _ in SECTIONS for f in dataclasses.fields(section)
    ]
    assert tuple(row for _, rows in SECTIONS for row in rows) == cfg.OPTIONS


def test_every_option_is_some_commands_and_each_command_takes_rows_of_the_table() -> None:
    taken = commands.AGENT + commands.DOCTOR + commands.BRIDGE + commands.TAIL
    assert set(cfg.OPTIONS) == set(taken)
    for command in (commands.AGENT, commands.BRIDGE, commands.TAIL):
        order = [cfg.OPTIONS.index(o) for o in command]
        assert order == sorted(set(order)), "a command lists its options once, in the table's order"


@pytest.mark.parametrize("module", MODULES)
def test_a_section_can_be_imported_first_and_costs_no_daemon_library(module: str) -> None:
    """A section's module imports config's parsers, and config assembles the sections: imported first, it
    must not find config half-built; and every command reads the options before it knows what it runs."""
    code = (
        f"import sys, {module}\n"
        "from gpu_exporter import config\n"
        "config.Config(); config.load({}, {})\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
