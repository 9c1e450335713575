"""One typed configuration for every command, declared per section.

Each section's options sit in its own module with the dataclass they fill: ``agent`` (GPUs, interval,
the web endpoint, logs, simulation), ``forwarding`` (MQTT link, batches, spool), ``bridge`` (the cloud
bridge and its remote-write target) and ``k8s``. ``model.Config`` is all the sections together;
``sources.load`` reads it from flag > env ``GPU_EXPORTER_*`` > YAML file > default, and ``checks`` holds
the checks across options made at start. This module is the package's public API.
"""

from __future__ import annotations

from gpu_exporter.config.agent import VENDORS
from gpu_exporter.config.model import ALL_OPTIONS, OPTIONS, Config, option_names, replace
from gpu_exporter.config.parsers import ConfigError, Option
from gpu_exporter.config.sources import ENV_PREFIX, add_arguments, env_name, load, read_file
from gpu_exporter.config.tls import error_reason, tls_context

__all__ = [
    "ALL_OPTIONS",
    "ENV_PREFIX",
    "OPTIONS",
    "VENDORS",
    "Config",
    "ConfigError",
    "Option",
    "add_arguments",
    "env_name",
    "error_reason",
    "load",
    "option_names",
    "read_file",
    "replace",
    "tls_context",
]
