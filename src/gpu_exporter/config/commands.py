"""Which command reads which option, assembled from the sections, so that every command's --help lists
only its own: ``gpu-exporter`` and its doctor read every section but the bridge's; ``gpu-exporter bridge``
reads its own section, the remote-write section, and what each other section shares with it."""

from __future__ import annotations

from gpu_exporter.config.agent import SHARED_WITH_BRIDGE
from gpu_exporter.config.forwarding import MQTT_CONNECTION
from gpu_exporter.config.model import OPTIONS
from gpu_exporter.config.parsers import Option

__all__ = ["BRIDGE_ONLY", "agent_option", "bridge_option", "bridge_options"]

# The cloud bridge's own sections (config/bridge.py); the agent (and its doctor) never reads them.
BRIDGE_ONLY = ("bridge.", "remote-write.")


def agent_option(name: str) -> bool:
    """True for the options of ``gpu-exporter`` and ``gpu-exporter doctor``."""
    return not name.startswith(BRIDGE_ONLY)


def bridge_option(name: str) -> bool:
    """True for the options of ``gpu-exporter bridge``."""
    return name.startswith(BRIDGE_ONLY) or name in SHARED_WITH_BRIDGE or name in MQTT_CONNECTION


def bridge_options() -> list[Option]:
    """The bridge's options, in the order of the option table."""
    return [o for o in OPTIONS if bridge_option(o.name)]
