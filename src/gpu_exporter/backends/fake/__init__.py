"""Simulated NVIDIA GPUs (the NVML simulator behind the NVML backend)."""

from gpu_exporter.backends.registry import Vendor, register

register(Vendor("fake", "gpu_exporter.backends.fake.backend:create", rank=4, auto=False))
