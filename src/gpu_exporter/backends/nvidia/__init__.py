"""NVIDIA GPUs through NVML (nvidia-ml-py)."""

from gpu_exporter.backends.registry import Vendor, register

register(Vendor("nvidia", "gpu_exporter.backends.nvidia.backend:create", rank=1))
