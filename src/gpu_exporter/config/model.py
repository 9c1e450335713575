"""Config: the sections together, and the option table they are read from.

Each section (agent, forwarding, bridge, remote write, Kubernetes) is a frozen dataclass declared with
its options in its own module; Config is all of them, so that a program that needs one section can take
that section's type, and the field names stay flat (``config.mqtt_url``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.config.agent import AGENT_OPTIONS, AgentOptions
from gpu_exporter.config.bridge import BRIDGE_OPTIONS, REMOTE_WRITE_OPTIONS, BridgeOptions, RemoteWriteOptions
from gpu_exporter.config.forwarding import FORWARD_OPTIONS, ForwardOptions
from gpu_exporter.config.k8s import K8S_OPTIONS, K8sOptions
from gpu_exporter.config.parsers import Option, parse_bool

__all__ = ["ALL_OPTIONS", "OPTIONS", "SWITCHES", "Config", "option_names", "replace"]


# The bases in reverse order of the fields: dataclasses collects the fields of the last base first.
@dataclass(frozen=True)
class Config(K8sOptions, RemoteWriteOptions, BridgeOptions, ForwardOptions, AgentOptions):
    """Every option of every command: flag > env ``GPU_EXPORTER_*`` > YAML file > default."""


OPTIONS: tuple[Option, ...] = AGENT_OPTIONS + FORWARD_OPTIONS + BRIDGE_OPTIONS + REMOTE_WRITE_OPTIONS + K8S_OPTIONS

SWITCHES = tuple(
    Option(f"collector.{group}", f"collector.{group}", parse_bool, f"collect the {group} metrics", is_switch=True)
    for group in catalog.GROUPS
)

ALL_OPTIONS = OPTIONS + SWITCHES
BY_NAME = {o.name: o for o in ALL_OPTIONS}


def replace(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, **changes)


def option_names() -> Sequence[str]:
    return [o.name for o in ALL_OPTIONS]
