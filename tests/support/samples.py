"""Fixed samples: the same readings every run, for pages compared as text."""

from __future__ import annotations

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.model import Sample


def fixed_sample(gpus: int = 2, mig: int = 2, config: Config | None = None) -> Sample:
    """Simulated NVIDIA GPUs read at a fixed wall time (by default without the XID collector)."""
    sim = SimNvml(gpus=gpus, mig=mig, clock=lambda: 1_700_000_000.0)
    backend = NvmlBackend(config or Config(disabled_collectors=frozenset({"xid"})), nvml=sim)
    backend.open()
    try:
        backend.read()  # primes GPM
        return Sample(1, 1_700_000_000.0, tuple(backend.read()))
    finally:
        backend.close()
