"""Per-pod series travel over MQTT too: a KubeEdge cloud cannot scrape the node's /metrics."""

from __future__ import annotations

from gpu_exporter.forward.prepare import round_values
from gpu_exporter.forward.tail import lines
from gpu_exporter.k8s import PodAttributor
from gpu_exporter.payload import Batch, decode, encode
from gpu_exporter.ring import RingBuffer
from tests.unit.k8s.test_k8s_attribution import _config, _fallback_sample


def _key(series: str, uuid: str | None = None) -> tuple[str, str, str]:
    """(family, device uuid, namespace/pod/container) of one exposition series."""
    name, _, rest = series.partition("{")
    labels = dict(pair.split("=", 1) for pair in rest.rstrip("}").split(","))
    pod = "/".join(labels[k].strip('"') for k in ("namespace", "pod", "container"))
    return name, uuid or labels["uuid"].strip('"'), pod


def _page_values(text: str) -> dict[tuple[str, str, str], float]:
    out = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            out[_key(series)] = float(value)
    return out


def test_pod_series_are_forwarded_with_the_sample_they_belong_to() -> None:
    attributor = PodAttributor(_config(), RingBuffer(4))
    first, second = _fallback_sample(1, 1000.0), _fallback_sample(2, 1001.0)
    attributor.process([first, second])
    served = _page_values(attributor.text())
    assert any(name == "gpu_pod_energy_joules_total" for name, _, _ in served)

    prepared = round_values(second, 0, None, attributor.device_values())
    shipped = decode(encode(Batch("edge-1", "boot-1", (prepared,))))
    forwarded = {
        _key(series, line["uuid"]): value
        for line in lines(shipped)
        for series, value in line["values"].items()
        if series.startswith("gpu_pod_")
    }
    # every per-pod series of /metrics is in the batch: same family, device, pod and value
    assert forwarded == served
    assert {uuid for _, uuid, _ in forwarded} == {"GPU-aaaa", "GPU-bbbb", "MIG-1111"}


def test_nothing_added_without_pods() -> None:
    sample = _fallback_sample(1, 1000.0)
    assert round_values(sample, 0, None, {}) is sample
