"""Chosen pod labels on the per-pod series, from the node's pod list (the kubelet's /pods, KubeEdge's
MetaServer), served by a real HTTP server on 127.0.0.1: off by default, allowlisted, capped and counted."""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpu_exporter.config import Config
from gpu_exporter.k8s import PodAttributor
from gpu_exporter.ring import RingBuffer
from tests.support.k8s_fakes import FakePodList
from tests.unit.k8s.test_k8s_attribution import EXPECTED_FALLBACK, _config, _fallback_sample

TRAINER_0 = "1a2b3c4d-0000-4000-8000-000000000001"  # the fixtures' pods, by the UIDs in their cgroups
RESNET = "22222222-2222-4222-8222-222222222222"


@pytest.fixture
def pod_list() -> Iterator[FakePodList]:
    fake = FakePodList().start()
    fake.pods = [
        FakePodList.pod(
            "trainer-0",
            "ml",
            TRAINER_0,
            {"app": "trainer", "team": "ml-infra", "app.kubernetes.io/name": "resnet", "secret-hash": "x1"},
        ),
        FakePodList.pod("resnet-7f9c", "inference", RESNET, {"app": "resnet", "team": "serving"}),
    ]
    yield fake
    fake.stop()


def _attributor(pod_list: FakePodList, registry: CollectorRegistry | None = None, **options: object) -> PodAttributor:
    now = [0.0]
    config = Config(**{**_config().__dict__, "k8s_pod_list_url": pod_list.url, **options})  # type: ignore[arg-type]
    attributor = PodAttributor(config, RingBuffer(8), registry, clock=lambda: now[0])
    attributor.now = now  # type: ignore[attr-defined]
    return attributor


def _series(text: str, pod: str) -> list[str]:
    return [line for line in text.splitlines() if f'pod="{pod}"' in line]


def test_no_pod_labels_and_no_request_without_the_option(pod_list: FakePodList) -> None:
    attributor = _attributor(pod_list)
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    assert attributor.text() == EXPECTED_FALLBACK.read_text(encoding="utf-8")  # the page as before
    assert pod_list.calls == 0


def test_allowlisted_labels_go_on_every_series_of_the_pod(pod_list: FakePodList) -> None:
    attributor = _attributor(pod_list, k8s_pod_labels=r"app|team|app\.kubernetes\.io/.+")
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    trainer = _series(attributor.text(), "trainer-0")
    assert len(trainer) == 4  # info, memory, utilization, energy
    for line in trainer:
        assert (
            line.split("{", 1)[1]
            .split("}")[0]
            .endswith(
                f'pod_uid="{TRAINER_0}",label_app="trainer",label_app_kubernetes_io_name="resnet",label_team="ml-infra"'
            )
        )
    assert "secret" not in attributor.text()  # not in the allowlist
    assert all('label_app="resnet",label_team="serving"' in line for line in _series(attributor.text(), "resnet-7f9c"))
    # pods the list does not name get none
    assert all("label_" not in line for line in _series(attributor.text(), "transcoder"))
    assert pod_list.calls == 1


def test_page_with_pod_labels_passes_promtool(pod_list: FakePodList) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    attributor = _attributor(pod_list, k8s_pod_labels=".*")
    attributor.process([_fallback_sample(1, 1000.0), _fallback_sample(2, 1002.0)])
    result = subprocess.run(
        [promtool, "check", "metrics"], input=attributor.text(), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_labels_are_capped_in_count_and_length_and_each_cut_is_counted_once(pod_list: FakePodList) -> None:
    pod_list.pods = [
        FakePodList.pod(
            "trainer-0",
            "ml",
            TRAINER_0,
            {"a.b": "1", "a_b": "2", "c": "x" * 300, "d": "4", "e": "5"},
        )
    ]
    registry = CollectorRegistry()
    attributor = _attributor(pod_list, registry, k8s_pod_labels=".*", k8s_pod_labels_max=3, k8s_pod_label_max_length=10)
    attributor.process([_fallback_sample(1, 1000.0)])
    line = _series(attributor.text(), "trainer-0")[0]
    assert line.endswith(f'pod_uid="{TRAINER_0}",label_a_b="1",label_c="xxxxxxxxxx",label_d="4"}} 1')
    metrics = generate_latest(registry).decode()
    assert 'gpu_exporter_k8s_pod_labels_cut_total{reason="name"} 1.0' in metrics  # a_b: label_a_b again
    assert 'gpu_exporter_k8s_pod_labels_cut_total{reason="length"} 1.0' in metrics  # c
    assert 'gpu_exporter_k8s_pod_labels_cut_total{reason="count"} 1.0' in metrics  # e, the fourth
    # the next list says the same: nothing new is counted
    attributor.now[0] = 60.0  # type: ignore[attr-defined]
    attributor.process([_fallback_sample(2, 1002.0)])
    assert pod_list.calls == 2
    assert generate_latest(registry).decode() == metrics


def test_a_failing_source_keeps_the_last_labels_and_is_counted(
    pod_list: FakePodList, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    attributor = _attributor(pod_list, registry, k8s_pod_labels="app")
    attributor.process([_fallback_sample(1, 1000.0)])
    assert 'label_app="trainer"' in attributor.text()
    with caplog.at_level(logging.WARNING, logger="gpu_exporter.k8s.podlabels"):
        for step, (status, body) in enumerate([(500, b"oops"), (200, b"<html>"), (200, b'{"items": 3}')], start=1):
            pod_list.status, pod_list.body = status, body
            attributor.now[0] = 60.0 * step  # type: ignore[attr-defined]
            attributor.process([_fallback_sample(1 + step, 1000.0 + step)])
            assert 'label_app="trainer"' in attributor.text()
    assert 'gpu_exporter_k8s_errors_total{source="pod_list"} 3.0' in generate_latest(registry).decode()
    assert len(caplog.records) == 1 and "\n" not in caplog.records[0].getMessage()  # once per outage


def test_kubeedge_metaserver_with_a_bearer_token(tmp_path: object) -> None:
    """EdgeCore's MetaServer answers /api/v1/pods from its local store; with authorization required it
    wants the pod's service-account token."""
    from pathlib import Path

    token = Path(str(tmp_path)) / "token"
    token.write_text("edge-token\n")
    fake = FakePodList("/api/v1/pods").start()
    try:
        fake.token = "edge-token"
        fake.pods = [FakePodList.pod("trainer-0", "ml", TRAINER_0, {"app": "trainer"})]
        attributor = _attributor(fake, k8s_pod_labels="app", k8s_pod_list_token_file=str(token))
        attributor.process([_fallback_sample(1, 1000.0)])
        assert 'label_app="trainer"' in attributor.text()
    finally:
        fake.stop()


def test_per_process_series_carry_the_pods_chosen_labels(pod_list: FakePodList) -> None:
    attributor = _attributor(pod_list, k8s_pod_labels="app", processes_series=True)
    attributor.process([_fallback_sample(1, 1000.0)])
    process = [ln for ln in attributor.text().splitlines() if ln.startswith("gpu_process_memory_used_bytes{")]
    assert any(
        'pid="1001"' in ln and ln.split("}")[0].endswith(f'pod_uid="{TRAINER_0}",label_app="trainer"') for ln in process
    )
    assert any('pid="1005"' in ln and "label_" not in ln for ln in process)  # Xorg: the host's
