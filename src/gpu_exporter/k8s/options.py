"""Kubernetes options: metric naming for dcgm-exporter's dashboards, and pod attribution."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_exporter.config.parsers import (
    Option,
    choice,
    int_between,
    parse_bool,
    parse_http_url,
    parse_idle_power,
    parse_interval,
    parse_path,
    parse_regex,
)

__all__ = ["K8S_OPTIONS", "K8sOptions"]


@dataclass(frozen=True)
class K8sOptions:
    metrics_naming: str = "native"
    k8s_pod_attribution: bool = False
    k8s_kubelet_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    k8s_pod_logs_path: str = "/var/log/pods"
    k8s_idle_power: float | None = None  # watts; None: the lowest power seen on each GPU
    k8s_refresh_interval: float = 10.0
    k8s_cdi_spec_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi")
    k8s_pod_labels: str = ""  # regex of label keys; "" serves none
    k8s_pod_list_url: str = "http://127.0.0.1:10255/pods"
    k8s_pod_list_token_file: str = ""
    k8s_pod_list_ca_file: str = ""
    k8s_pod_labels_max: int = 8
    k8s_pod_label_max_length: int = 128
    k8s_virtual_gpus: bool = False
    k8s_resource_slices: bool = False
    k8s_api_url: str = ""  # "": the in-cluster service (KUBERNETES_SERVICE_HOST)
    k8s_api_token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    k8s_api_ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    k8s_max_pods_per_gpu: int = 64
    processes_series: bool = False
    processes_series_max: int = 10


def parse_paths(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated absolute paths (or a YAML list of them)."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    return tuple(parse_path(str(item).strip()) for item in items if str(item).strip())


K8S_OPTIONS: tuple[Option, ...] = (
    Option(
        "metrics.naming",
        "metrics_naming",
        choice("native", "dcgm"),
        "metric names on /metrics: native (gpu_*) or dcgm (dcgm-exporter's DCGM_FI_* names, units "
        "and labels, for its dashboards and alerts)",
        "STYLE",
    ),
    Option(
        "k8s.pod-attribution",
        "k8s_pod_attribution",
        parse_bool,
        "map GPU processes to Kubernetes pods (gpu_pod_* metrics), in the background",
        "BOOL",
    ),
    Option(
        "k8s.kubelet-socket",
        "k8s_kubelet_socket",
        parse_path,
        "kubelet pod-resources socket; when absent (KubeEdge) pods are found through /proc cgroups",
        "PATH",
    ),
    Option(
        "k8s.pod-logs-path",
        "k8s_pod_logs_path",
        parse_path,
        "the kubelet's pod log directory, whose names give namespace, pod and container "
        "(its sibling containers/ maps container IDs to names)",
        "PATH",
    ),
    Option(
        "k8s.idle-power",
        "k8s_idle_power",
        parse_idle_power,
        "GPU idle power in watts, subtracted before energy is split among pods "
        "(default: the lowest power seen on each GPU)",
        "WATTS",
    ),
    Option(
        "k8s.refresh-interval",
        "k8s_refresh_interval",
        parse_interval,
        "how often the kubelet's pod-resources List is asked and the pod log directories are re-indexed "
        "(a new pod's process is looked up at once)",
        "DURATION",
    ),
    Option(
        "k8s.cdi-spec-dirs",
        "k8s_cdi_spec_dirs",
        parse_paths,
        "CDI spec directories (comma-separated) where DRA drivers describe the devices of a claim: resolves "
        "a DRA GPU or MIG device to its UUID without the API server",
        "PATHS",
    ),
    Option(
        "k8s.resource-slices",
        "k8s_resource_slices",
        parse_bool,
        "resolve DRA devices that no CDI spec names through this node's ResourceSlices on the API server "
        "(needs a mounted service-account token allowed to list resourceslices)",
        "BOOL",
    ),
    Option(
        "k8s.api-url",
        "k8s_api_url",
        parse_http_url,
        "the API server for k8s.resource-slices (default: the in-cluster service)",
        "URL",
    ),
    Option(
        "k8s.api-token-file",
        "k8s_api_token_file",
        parse_path,
        "the service-account token for k8s.resource-slices",
        "PATH",
    ),
    Option(
        "k8s.api-ca-file",
        "k8s_api_ca_file",
        parse_path,
        "the API server's CA for k8s.resource-slices",
        "PATH",
    ),
    Option(
        "k8s.pod-labels",
        "k8s_pod_labels",
        parse_regex,
        "pod label keys (a regular expression, matched in full) to put on the per-pod series as label_<key>, "
        "read from the node's pod list (k8s.pod-list-url); empty: no pod labels",
        "REGEX",
    ),
    Option(
        "k8s.pod-list-url",
        "k8s_pod_list_url",
        parse_http_url,
        "where the node's pods and their labels are listed: the kubelet's /pods (read-only port 10255, or "
        "https on 10250 with a token), or KubeEdge's MetaServer (http://127.0.0.1:10550/api/v1/pods)",
        "URL",
    ),
    Option(
        "k8s.pod-list-token-file",
        "k8s_pod_list_token_file",
        parse_path,
        "bearer token for k8s.pod-list-url (a service-account token allowed nodes/proxy for the kubelet's 10250)",
        "PATH",
    ),
    Option(
        "k8s.pod-list-ca-file",
        "k8s_pod_list_ca_file",
        parse_path,
        "CA certificate for an https k8s.pod-list-url (the kubelet's serving certificate, when self-signed)",
        "PATH",
    ),
    Option(
        "k8s.pod-labels-max",
        "k8s_pod_labels_max",
        int_between(1, 64),
        "most pod labels put on one pod's series (the first by key); the rest are counted, not served",
        "N",
    ),
    Option(
        "k8s.pod-label-max-length",
        "k8s_pod_label_max_length",
        int_between(1, 256),
        "longest pod label value served, in characters; a longer one is cut and counted",
        "N",
    ),
    Option(
        "k8s.max-pods-per-gpu",
        "k8s_max_pods_per_gpu",
        int_between(1, 10000),
        "per-pod series for at most this many containers per GPU or MIG instance (those using the most "
        "memory, then the most SM, then holders by name); the rest are counted (gpu_exporter_k8s_pods_cut)",
        "N",
    ),
    Option(
        "k8s.virtual-gpus",
        "k8s_virtual_gpus",
        parse_bool,
        "with --metrics.naming=dcgm, serve a device held by pods once per pod (time-slicing: each with its "
        "vgpu replica; GPU_UTIL and FB_USED with the pod's own share), as dcgm-exporter's --kubernetes-virtual-gpus",
        "BOOL",
    ),
    Option(
        "processes.series",
        "processes_series",
        parse_bool,
        "per-process series: device memory and SM utilization of each GPU process, with pid, process_name "
        "and, with pod attribution, its pod (gpu_process_*)",
        "BOOL",
    ),
    Option(
        "processes.series-max",
        "processes_series_max",
        int_between(1, 1000),
        "per-process series for at most this many processes per GPU or MIG instance, the top by memory; "
        "the rest are counted (gpu_exporter_process_series_cut)",
        "N",
    ),
)
