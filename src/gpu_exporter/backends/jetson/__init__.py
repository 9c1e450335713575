"""NVIDIA Jetson GPUs through sysfs and procfs."""

from gpu_exporter.backends.registry import Vendor, register

register(Vendor("jetson", "gpu_exporter.backends.jetson.backend:create", rank=3))
