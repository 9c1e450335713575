"""/readyz turns ready only once the metrics page holds a sample.

The sampler puts a sample in the ring before its listeners render the page: a readiness that looked at
the ring alone answered ready while /metrics was still empty, and a scrape right then got a 200 with no
series (Prometheus would record the target as up without a single GPU series).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.cli import readiness
from gpu_exporter.config import Config
from gpu_exporter.exposition import Exposition, native_view
from gpu_exporter.ring import RingBuffer
from gpu_exporter.sampler import Sampler


def test_not_ready_between_the_ring_and_the_page() -> None:
    backend = NvmlBackend(Config(), nvml=SimNvml(gpus=1))
    backend.open()
    try:
        ring = RingBuffer(8)
        exposition = Exposition(CollectorRegistry(), native_view())
        seen: list[tuple[bool, str]] = []
        # a listener that runs before the page is rendered sees what a probe would see at that moment
        listener = lambda sample: seen.append(readiness(ring, exposition, [backend], None))  # noqa: E731
        sampler = Sampler([backend], ring, 1.0, [listener, exposition.update])
        sampler.collect_once()
        assert seen == [(False, "no sample yet")], "ready while /metrics was still empty"
        assert readiness(ring, exposition, [backend], None) == (True, "ready")
        assert exposition.page(False) != b""
    finally:
        backend.close()
