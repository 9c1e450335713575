"""Pod attribution stays bounded on a hostile or huge node (issue 33): per-pod series capped per GPU,
the kubelet asked once per refresh interval, the pod log directories not re-read without end, and the
kubelet's error texts not remembered one by one."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor, podlogs
from gpu_exporter.model import ProcessUsage
from gpu_exporter.ring import RingBuffer
from tests.support.k8s_fakes import FakeKubelet
from tests.unit.k8s.test_k8s_attribution import GPU0, _config, _device, _fallback_sample, _sample


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    fake = FakeKubelet().start()
    yield fake
    fake.stop()


def _node(root: Path, pods: int) -> tuple[Path, Path]:
    """A /proc and /var/log/pods with one GPU process in each of ``pods`` pods."""
    proc, logs = root / "proc", root / "var" / "log" / "pods"
    for i in range(pods):
        uid = f"{i:08x}-0000-4000-8000-000000000000"
        (proc / str(10_000 + i)).mkdir(parents=True)
        (proc / str(10_000 + i) / "cgroup").write_text(f"0::/kubepods/besteffort/pod{uid}/{i:064x}\n")
        (logs / f"batch_job-{i}_{uid}" / "main").mkdir(parents=True)
    (root / "var" / "log" / "containers").mkdir()
    return proc, logs


def test_four_thousand_pods_on_one_gpu_give_capped_per_pod_series(tmp_path: Path) -> None:
    """4,000 processes, each its own pod, on one GPU: the series of the 64 using the most memory, and
    the other 3,936 counted (they gave 16,000 per-pod series before)."""
    proc, logs = _node(tmp_path, 4000)
    config = Config(path_procfs=str(proc), k8s_pod_logs_path=str(logs), k8s_kubelet_socket=str(tmp_path / "no.sock"))
    registry = CollectorRegistry()
    attributor = PodAttributor(config, RingBuffer(8), registry)
    processes = [ProcessUsage(10_000 + i, float(1 << 20) * (i + 1), 0.0) for i in range(4000)]
    attributor.process([_sample(1, 1000.0, _device(GPU0, 100.0, *processes))])
    info = [line for line in attributor.text().splitlines() if line.startswith("gpu_pod_info{")]
    assert len(info) == 64
    assert {line.split('pod="')[1].split('"')[0] for line in info} == {f"job-{i}" for i in range(3936, 4000)}
    assert sum(1 for line in attributor.text().splitlines() if not line.startswith("#")) <= 4 * 64
    assert "gpu_exporter_k8s_pods_cut 3936.0" in generate_latest(registry).decode()


def test_the_kubelet_is_asked_once_per_refresh_interval(kubelet: FakeKubelet) -> None:
    kubelet.pods = [("trainer-0", "ml", [("trainer", [("nvidia.com/gpu", ["GPU-aaaa"])])])]
    now = [0.0]
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8), clock=lambda: now[0])
    for seq in range(1, 21):  # a sample each 0.25 s for 5 s
        attributor.process([_fallback_sample(seq, 1000.0 + seq)])
        now[0] += 0.25
    assert kubelet.calls == 1
    now[0] = 10.0
    attributor.process([_fallback_sample(30, 1030.0)])
    assert kubelet.calls == 2


def test_a_process_whose_pod_has_no_log_directory_does_not_keep_them_reread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PID 1007's pod is deleted: its log directory is gone. Looked for again after 1, 2, 4 ... s, not
    at every sample (each scan of a node with 100,000 leftover directories took a core)."""
    scans = []
    real = podlogs.scan

    def counting(*args: object, **kwargs: object) -> podlogs.PodDirectory:
        scans.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(podlogs, "scan", counting)
    now = [0.0]
    config = Config(**{**_config().__dict__, "k8s_refresh_interval": 3600.0})  # type: ignore[arg-type]
    attributor = PodAttributor(config, RingBuffer(8), clock=lambda: now[0])
    for seq in range(1, 31):  # 30 samples, 1.5 s apart
        attributor.process([_sample(seq, 1000.0 + seq, _device(GPU0, None, ProcessUsage(1007, 1e9, 0.5)))])
        now[0] += 1.5
    assert len(scans) <= 6  # at 0, 1.5, 4.5, 9, 18 and 34.5 s


def test_a_log_directory_scan_reads_a_bounded_number_of_entries(tmp_path: Path) -> None:
    _proc, logs = _node(tmp_path, 150)
    directory = podlogs.scan(logs, limit=100)
    assert directory.truncated and len(directory.pods) == 100
    assert not podlogs.scan(logs).truncated and len(podlogs.scan(logs).pods) == 150


def test_distinct_kubelet_error_texts_are_said_once_per_kind(
    kubelet: FakeKubelet, caplog: pytest.LogCaptureFixture
) -> None:
    """A kubelet whose every error differs (a request id, a timestamp) made one log line and one
    remembered string per error, forever."""
    kubelet.fail = grpc.StatusCode.UNAVAILABLE
    now = [0.0]
    registry = CollectorRegistry()
    attributor = PodAttributor(_config(kubelet.socket), RingBuffer(8), registry, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.k8s.holders"):
        for i in range(50):
            kubelet.detail = f"connection reset, request {i:06d}"
            attributor.process([_fallback_sample(i + 1, 1000.0 + i)])
            now[0] += 10.0
    assert kubelet.calls == 50
    assert 'gpu_exporter_k8s_errors_total{source="pod_resources"} 50.0' in generate_latest(registry).decode()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "UNAVAILABLE" in warnings[0] and "request 000000" in warnings[0]
