"""Switching to --metrics.naming=dcgm loses nothing: every series of the default page is served, under
its DCGM field where there is one and under its own name otherwise, and the last XID is served as
dcgm-exporter serves it."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter import catalog
from gpu_exporter.backends.fake.backend import SimNvml
from gpu_exporter.backends.nvidia.backend import NvmlBackend
from gpu_exporter.config import Config
from gpu_exporter.exposition import native_view, render
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.naming import dcgm_view
from tests.unit.backends.test_health import read_until_xid

GPU = DeviceId("0", "GPU-aaaa")
INFO = {"name": "NVIDIA H100", "pci_bus_id": "00000000:18:00.0", "device": "nvidia0", "driver_version": "550"}


def _one_series_page(metric: catalog.Metric, view_name: str) -> list[tuple[str, float]]:
    labels = tuple("x" for _ in metric.labels)
    sample = Sample(1, 1000.0, (DeviceSample(GPU, True, {(metric.key, labels): 3.0}, dict(INFO)),))
    view = native_view() if view_name == "native" else dcgm_view("edge-1")
    families = text_string_to_metric_families(render(sample, view))
    # (family name, value); the parser names a counter family without its _total
    return [(f.name, s.value) for f in families if f.name not in ("gpu_up", "gpu_info") for s in f.samples]


@pytest.mark.parametrize("metric", catalog.CATALOG, ids=lambda m: m.key)
def test_every_catalog_key_served_by_default_is_served_in_dcgm_mode(metric: catalog.Metric) -> None:
    native = _one_series_page(metric, "native")
    assert native, f"{metric.key} is not on the default page"
    dcgm = _one_series_page(metric, "dcgm")
    assert dcgm, f"{metric.key} is lost in dcgm mode"
    name, value = dcgm[0]
    if metric.dcgm and not metric.labels:  # (and perhaps an older field's alias beside it)
        assert (metric.dcgm, pytest.approx(3.0 * metric.dcgm_scale)) in dcgm
    else:
        assert len(dcgm) == 1
        assert (name, value) == (native[0][0], 3.0)
        assert metric.name.removesuffix("_total") == name


def test_dcgm_page_of_simulated_gpus_shows_the_last_xid_and_the_xid_counts() -> None:
    sim = SimNvml(gpus=2)
    backend = NvmlBackend(Config(), nvml=sim, xid_wait_ms=20)
    backend.open()
    try:
        backend.read()
        sim.xid(1, 48)
        sim.xid(1, 79)
        devices = read_until_xid(backend, 1, 79)
    finally:
        backend.close()
    page = render(Sample(1, 1000.0, tuple(devices)), dcgm_view("edge-1"))
    families = {f.name: f for f in text_string_to_metric_families(page)}
    last = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert last == {"0": 0.0, "1": 79.0}
    assert families["DCGM_FI_DEV_XID_ERRORS"].type == "gauge"
    counts = {
        (s.labels["gpu"], s.labels["xid"]): s.value
        for s in families["gpu_xid_errors"].samples  # the parser drops _total from the family name
    }
    assert counts[("1", "79")] == 1 and counts[("1", "48")] == 1 and counts[("0", "79")] == 0
    assert all("UUID" in s.labels for s in families["gpu_xid_errors"].samples)  # DCGM's labels


def test_gpu_up_and_gpu_info_are_served_in_dcgm_mode_with_dcgm_labels() -> None:
    down = DeviceId("1", "GPU-bbbb")
    sample = Sample(
        1,
        1000.0,
        (
            DeviceSample(GPU, True, {("utilization", ()): 0.5}, dict(INFO, serial="1320")),
            DeviceSample(down, False, info=dict(INFO, device="nvidia1")),
        ),
    )
    families = {f.name: f for f in text_string_to_metric_families(render(sample, dcgm_view("edge-1")))}
    up = {s.labels["gpu"]: s.value for s in families["gpu_up"].samples}
    assert up == {"0": 1.0, "1": 0.0}  # an alert on gpu_up == 0 works in both modes
    assert all(s.labels["UUID"] and s.labels["hostname"] == "edge-1" for s in families["gpu_up"].samples)
    info = next(s for s in families["gpu_info"].samples if s.labels["gpu"] == "0")
    assert info.labels["serial"] == "1320" and info.labels["modelName"] == "NVIDIA H100"
