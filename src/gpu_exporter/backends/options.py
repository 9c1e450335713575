"""The backends' options: the vendors there are (``registry``), the simulated GPUs of ``--gpu-vendor=fake``
(``fake/``) and the OS paths the backends (and pod attribution) read, pointed at fixture trees in tests."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.backends import registry
from gpu_exporter.config.parsers import Option, duration_at_least, int_between, parse_nonneg_int, parse_path

__all__ = ["BACKEND_OPTIONS", "VENDORS", "BackendOptions"]

VENDORS = ("auto", *registry.vendors())


@dataclass(frozen=True)
class BackendOptions:
    fake_gpus: int = 2
    fake_mig: int = 0
    fake_seed: int = 0
    fake_pcie_call_seconds: float = 0.0  # simulated time each PCIe throughput call blocks
    path_sysfs: str = "/sys"
    path_procfs: str = "/proc"


BACKEND_OPTIONS: tuple[Option, ...] = (
    Option("fake.gpus", "fake_gpus", int_between(1, 64), "simulated GPUs for --gpu-vendor=fake", "N"),
    Option(
        "fake.mig",
        "fake_mig",
        parse_nonneg_int,
        "MIG instances on the first simulated GPU (0 disables MIG; at most 7)",
        "N",
    ),
    Option("fake.seed", "fake_seed", int_between(0, 2**32 - 1), "seed for the simulated values", "N"),
    Option(
        "fake.pcie-call-duration",
        "fake_pcie_call_seconds",
        duration_at_least(0.0),
        "time each simulated PCIe throughput call blocks, as a real driver samples the link (e.g. 20ms)",
        "DURATION",
    ),
    Option("path.sysfs", "path_sysfs", parse_path, "sysfs mount point", "PATH"),
    Option("path.procfs", "path_procfs", parse_path, "procfs mount point", "PATH"),
)
