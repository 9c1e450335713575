"""AMD GPUs through AMD SMI (amdsmi)."""

from gpu_exporter.backends.registry import Vendor, register

register(Vendor("amd", "gpu_exporter.backends.amd.backend:create", rank=2))
