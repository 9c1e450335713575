"""``gpu-exporter doctor``: the troubleshooting checklist as a command (see ``main``)."""

from gpu_exporter.doctor.cli import main

__all__ = ["main"]
