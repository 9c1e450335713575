"""Which NVML devices are a Jetson's integrated GPU, which the Jetson backend reads instead.

On a Jetson the NVML library enumerates the integrated GPU too: JetPack 7's L4T NVML names an Orin's
"Orin (nvgpu)" and answers no reading for it, and Thor's GPU, on the ``nvidia.ko`` stack, is "NVIDIA
Thor", with utilization and processes but no memory, clocks, power or temperature. Its clocks, sensors
and power rails are in sysfs, which only the Jetson backend reads: so the NVIDIA backend leaves such a
device alone (a discrete card in a Jetson's PCIe slot stays its own), and the Jetson backend asks NVML
only for what NVML answers on Thor. The NVML name is the only fact both backends see the same way.
"""

from __future__ import annotations

__all__ = ["is_integrated"]


def is_integrated(name: str) -> bool:
    """Whether an NVML device name is a Jetson's integrated GPU: "(nvgpu)", the L4T NVML over the nvgpu
    driver (Orin, JetPack 6 and 7), or the word "Thor" (Jetson Thor, JetPack 7)."""
    lowered = name.lower()
    return "(nvgpu)" in lowered or "thor" in lowered.split()
