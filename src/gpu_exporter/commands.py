"""Which command reads which option: derived from the option's name, so each option is declared once
(config.OPTIONS) and every command's --help lists only its own."""

from __future__ import annotations

__all__ = ["BRIDGE_ONLY", "agent_option"]

# The cloud bridge's own options; the agent (and its doctor) never reads them.
BRIDGE_ONLY = ("bridge.", "remote-write.")


def agent_option(name: str) -> bool:
    """True for the options of ``gpu-exporter`` and ``gpu-exporter doctor``."""
    return not name.startswith(BRIDGE_ONLY)
