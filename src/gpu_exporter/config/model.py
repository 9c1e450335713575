"""Config: the sections together, and the option table they are read from.

Each section is a frozen dataclass declared with its options next to the code it configures (sampling
and the agent's own: ``agent_options.py``; the endpoint: ``web/options.py``; simulation and paths:
``backends/options.py``; forwarding, the bridge, remote write, Kubernetes: ``forward/``, ``bridge/``,
``k8s/options.py``); Config is all of them, so that a program that needs one section can take that
section's type, and the field names stay flat (``config.mqtt_url``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_exporter import catalog
from gpu_exporter.agent_options import (
    AGENT_OPTIONS,
    DISABLE_DEFAULTS,
    SAMPLING_OPTIONS,
    AgentOptions,
    SamplingOptions,
)
from gpu_exporter.backends.options import BACKEND_OPTIONS, BackendOptions
from gpu_exporter.bridge.options import BRIDGE_OPTIONS, REMOTE_WRITE_OPTIONS, BridgeOptions, RemoteWriteOptions
from gpu_exporter.config.parsers import Option, parse_bool
from gpu_exporter.forward.options import FORWARD_OPTIONS, ForwardOptions
from gpu_exporter.k8s.options import K8S_OPTIONS, K8sOptions
from gpu_exporter.web.options import WEB_OPTIONS, WebOptions

__all__ = ["ALL_OPTIONS", "DISABLE_DEFAULTS", "OPTIONS", "SWITCHES", "Config", "option_names", "replace"]


# The bases in reverse order of the fields: dataclasses collects the fields of the last base first.
@dataclass(frozen=True)
class Config(
    K8sOptions,
    RemoteWriteOptions,
    BridgeOptions,
    ForwardOptions,
    BackendOptions,
    AgentOptions,
    WebOptions,
    SamplingOptions,
):
    """Every option of every command: flag > env ``GPU_EXPORTER_*`` > YAML file > default."""


# In the order of every command's --help.
OPTIONS: tuple[Option, ...] = (
    SAMPLING_OPTIONS
    + WEB_OPTIONS
    + AGENT_OPTIONS
    + BACKEND_OPTIONS
    + FORWARD_OPTIONS
    + BRIDGE_OPTIONS
    + REMOTE_WRITE_OPTIONS
    + K8S_OPTIONS
)

SWITCHES = tuple(
    Option(f"collector.{group}", f"collector.{group}", parse_bool, f"collect the {group} metrics", is_switch=True)
    for group in catalog.GROUPS
)

ALL_OPTIONS = (*OPTIONS, DISABLE_DEFAULTS, *SWITCHES)
BY_NAME = {o.name: o for o in ALL_OPTIONS}


def replace(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, **changes)


def option_names() -> Sequence[str]:
    return [o.name for o in ALL_OPTIONS]
