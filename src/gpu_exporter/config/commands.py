"""Which command reads which option: each command's options, section by section, in the order its
--help lists them. Every section is declared next to the code it configures (``config/model.py`` names
them all); a command takes whole sections, or the rows of one that it shares.

- ``gpu-exporter`` and ``gpu-exporter doctor`` (which checks what the agent would run with): every section
  but the bridge's two, and the collector switches.
- ``gpu-exporter bridge``: its own section and remote write's; from the others, the endpoint's TLS, auth
  and limits, the logs, and the broker connection it subscribes with.
- ``gpu-exporter tail``: the broker connection it subscribes with, and the protocol version.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_exporter.agent_options import AGENT_OPTIONS, LOG_OPTIONS, SAMPLING_OPTIONS
from gpu_exporter.backends.options import BACKEND_OPTIONS
from gpu_exporter.bridge.options import BRIDGE_OPTIONS, REMOTE_WRITE_OPTIONS
from gpu_exporter.config.parsers import Option
from gpu_exporter.forward.options import FORWARD_OPTIONS, MQTT_CONNECTION
from gpu_exporter.k8s.options import K8S_OPTIONS
from gpu_exporter.web.options import ENDPOINT_OPTIONS, WEB_OPTIONS

__all__ = ["AGENT", "BRIDGE", "DOCTOR", "TAIL"]


def _rows(section: Sequence[Option], names: Sequence[str]) -> tuple[Option, ...]:
    """The rows of ``section`` named in ``names``, in the section's order."""
    missing = set(names) - {o.name for o in section}
    if missing:
        raise ValueError(f"no such option in the section: {sorted(missing)}")
    return tuple(o for o in section if o.name in names)


AGENT: tuple[Option, ...] = (
    SAMPLING_OPTIONS + WEB_OPTIONS + AGENT_OPTIONS + BACKEND_OPTIONS + FORWARD_OPTIONS + K8S_OPTIONS
)

DOCTOR = AGENT

BRIDGE: tuple[Option, ...] = (
    ENDPOINT_OPTIONS + LOG_OPTIONS + _rows(FORWARD_OPTIONS, MQTT_CONNECTION) + BRIDGE_OPTIONS + REMOTE_WRITE_OPTIONS
)

# The connection the bridge subscribes with, and the protocol version; no --mqtt.keepalive flag (a reader
# run by hand), though GPU_EXPORTER_MQTT_KEEPALIVE and the config file set it, as for every command.
TAIL: tuple[Option, ...] = _rows(
    FORWARD_OPTIONS, ("mqtt.protocol", *(name for name in MQTT_CONNECTION if name != "mqtt.keepalive"))
)
