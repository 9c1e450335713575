"""One typed configuration for every command; the options are declared next to the code they configure.

Each section is a frozen dataclass declared with its options beside its code: ``agent_options`` (what is
read, how often, the node, logs, metric filters), ``web/options`` (the HTTP endpoint),
``backends/options`` (simulation and OS paths), ``forward/options`` (MQTT link, batches, spool),
``bridge/options`` (the cloud bridge and its remote-write target) and ``k8s/options``. This package is
the machinery: ``parsers`` (the Option row and its value parsers), ``model.Config`` (all the sections),
``commands`` (which command reads which option), ``sources.load`` (flag > env ``GPU_EXPORTER_*`` > YAML
file > default) and ``checks`` (the checks across options made at start). This module is its public API.

The names that need the sections (``Config``, ``OPTIONS``, ``load``...) are imported on first use, so
that a section's module can import ``config.parsers`` before ``config`` has assembled the sections.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_exporter import lazy
from gpu_exporter.config.parsers import ConfigError, Option

if TYPE_CHECKING:
    from gpu_exporter.backends.options import VENDORS
    from gpu_exporter.config.model import ALL_OPTIONS, OPTIONS, Config, option_names, replace
    from gpu_exporter.config.sources import ENV_PREFIX, add_arguments, env_name, load, read_file

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
    "load",
    "option_names",
    "read_file",
    "replace",
]

_LAZY = {
    "VENDORS": "gpu_exporter.backends.options",
    **dict.fromkeys(("ALL_OPTIONS", "OPTIONS", "Config", "option_names", "replace"), "gpu_exporter.config.model"),
    **dict.fromkeys(("ENV_PREFIX", "add_arguments", "env_name", "load", "read_file"), "gpu_exporter.config.sources"),
}


__getattr__ = lazy.exports(globals(), _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
