"""Pod attribution's own metrics (``gpu_exporter_k8s_*``, ``gpu_exporter_process_series_cut``); every
method is a no-op without a registry (the tests' and benches' attributors)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["AttributionMetrics"]


class AttributionMetrics:
    def __init__(self, registry: CollectorRegistry | None, pod_labels: bool, process_series: bool) -> None:
        self._errors = self._pods = self._pods_cut = self._claims = None
        self._labels_cut: Counter | None = None
        self._process_cut: Gauge | None = None
        if registry is None:
            return
        self._errors = Counter(
            "gpu_exporter_k8s_errors", "Pod attribution failures, by source.", ["source"], registry=registry
        )
        self._pods = Gauge(
            "gpu_exporter_k8s_pods", "Containers attributed to GPUs in the newest sample.", registry=registry
        )
        self._pods_cut = Gauge(
            "gpu_exporter_k8s_pods_cut",
            "Containers of the newest sample left off the per-pod series by k8s.max-pods-per-gpu.",
            registry=registry,
        )
        self._claims = Gauge(
            "gpu_exporter_k8s_claim_devices",
            "DRA claim devices in the kubelet's last answer, by whether they name a GPU of the newest "
            "sample (unmatched: another driver's device, a CDI spec not readable, a MIG device not seen yet).",
            ["state"],
            registry=registry,
        )
        if pod_labels:
            self._labels_cut = Counter(
                "gpu_exporter_k8s_pod_labels_cut",
                "Pod labels matching k8s.pod-labels left off a pod (count, name: two keys that give one label "
                "name) or cut short (length), once per pod and key.",
                ["reason"],
                registry=registry,
            )
        if process_series:
            self._process_cut = process_cut_gauge(registry)

    def error(self, source: str) -> None:
        if self._errors is not None:
            self._errors.labels(source).inc()

    def labels_cut(self, reason: str, n: int) -> None:
        if self._labels_cut is not None:
            self._labels_cut.labels(reason).inc(n)

    def sample(self, pods: int, pods_cut: int, claims: tuple[int, int], process_cut: int) -> None:
        """The newest sample's figures."""
        if self._pods is not None:
            self._pods.set(pods)
        if self._pods_cut is not None:
            self._pods_cut.set(pods_cut)
        if self._claims is not None:
            self._claims.labels("matched").set(claims[0])
            self._claims.labels("unmatched").set(claims[1])
        if self._process_cut is not None:
            self._process_cut.set(process_cut)


def process_cut_gauge(registry: CollectorRegistry) -> Gauge:
    return Gauge(
        "gpu_exporter_process_series_cut",
        "GPU processes of the newest sample left off the per-process series by --processes.series-max.",
        registry=registry,
    )
