"""Which NVML device names are a Jetson's integrated GPU (left to the Jetson backend)."""

from __future__ import annotations

import pytest

from gpu_exporter.backends.nvidia.integrated import is_integrated


@pytest.mark.parametrize("name", ["Orin (nvgpu)", "NVIDIA Thor", "Thor"])
def test_a_jetsons_gpu_as_nvml_names_it(name: str) -> None:
    assert is_integrated(name)


@pytest.mark.parametrize(
    "name",
    # a card in a Jetson's slot, a data-centre GPU, DGX Spark's GB10 (integrated, but no Jetson: NVML is all it has)
    ["NVIDIA RTX A2000", "NVIDIA H100 80GB HBM3", "NVIDIA GB10", "NVIDIA GH200 480GB", "Thorium X1"],
)
def test_other_gpus_stay_the_nvidia_backends(name: str) -> None:
    assert not is_integrated(name)
