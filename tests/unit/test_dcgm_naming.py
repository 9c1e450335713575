"""--metrics.naming=dcgm: dcgm-exporter's default counters under their names, types, units and labels."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_exporter import catalog
from gpu_exporter.exposition import render
from gpu_exporter.k8s.model import PodRef
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.naming import dcgm_fields, dcgm_view
from tests.support import child_env, free_port, paths, promtool_check

ROOT = paths.ROOT
EXPECTED = paths.FIXTURES / "dcgm" / "default-counters.expected.csv"

# From our base units (hertz, bytes, joules, ratios 0-1, ...) to the unit DCGM states.
FACTOR = {"MHz": 1e-6, "MiB": 1 / 2**20, "mJ": 1e3, "%": 100.0, "KB": 1 / 1024, "us": 1e6}
BASE = float(2**21)  # every reading in the test sample; 2 MiB, 2.097152 MHz, ...

GPU0 = DeviceId("0", "GPU-aaaa")
GPU1 = DeviceId("1", "GPU-bbbb")
MIG = DeviceId("0", "MIG-1111", "7", "0", "1g.10gb", "GPU-aaaa")
INFO = {
    "name": "NVIDIA A100-SXM4-40GB",
    "pci_bus_id": "00000000:07:00.0",
    "device": "nvidia0",
    "driver_version": "550.54.15",
    "serial": "1320",
}
STANDARD = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "DCGM_FI_DRIVER_VERSION"]


def _expected() -> list[dict[str, str]]:
    lines = [ln for ln in EXPECTED.read_text(encoding="utf-8").splitlines() if ln and not ln.startswith("#")]
    return [dict(zip(["field", "type", "unit", "status"], row, strict=True)) for row in csv.reader(lines)]


def _sample() -> Sample:
    values = {(m.key, ()): BASE for m in catalog.CATALOG if not m.labels}
    info1 = dict(INFO, device="nvidia1", pci_bus_id="00000000:0F:00.0")
    return Sample(
        1,
        1000.0,
        (
            DeviceSample(GPU0, True, dict(values), dict(INFO)),
            DeviceSample(MIG, True, {("memory_used", ()): BASE}, dict(INFO)),
            DeviceSample(GPU1, True, dict(values), info1),
        ),
    )


def _page(pods: dict[str, tuple[PodRef, ...]] | None = None) -> str:
    view = dcgm_view("edge-1", pods=(lambda uuid: pods.get(uuid, ())) if pods is not None else None)
    return render(_sample(), view)


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_default_counters_served_with_dcgm_names_types_and_units() -> None:
    families = _families(_page())
    served = [row for row in _expected() if row["status"] == "served"]
    assert len(served) >= 18
    for row in served:
        family = families.get(row["field"])
        assert family is not None, f"{row['field']} missing from the DCGM page"
        assert family.type == row["type"], row["field"]  # type: ignore[attr-defined]
        expected = BASE * FACTOR.get(row["unit"], 1.0)
        gpu0 = [s for s in family.samples if s.labels["gpu"] == "0" and "GPU_I_ID" not in s.labels]  # type: ignore[attr-defined]
        assert gpu0, row["field"]
        assert gpu0[0].value == pytest.approx(expected), f"{row['field']} is not in {row['unit']}"
        if row["unit"] not in ("count", "bool", "ratio", "state", "xid"):
            assert f"(in {row['unit']})" in family.documentation  # type: ignore[attr-defined]


def test_dashboard_12239_finds_its_fields_and_labels() -> None:
    lines = (paths.FIXTURES / "dcgm" / "dashboard-12239.txt").read_text(encoding="utf-8")
    charted = [ln.split() for ln in lines.splitlines() if ln and not ln.startswith("#")]
    families = _families(_page())
    for field, *absent in charted:
        if absent:
            assert field not in families
            continue
        samples = families[field].samples  # type: ignore[attr-defined]
        assert {s.labels["gpu"] for s in samples} >= {"0", "1"}, field
    assert {s.labels["gpu"] for s in families["DCGM_FI_DEV_GPU_TEMP"].samples} == {"0", "1"}  # type: ignore[attr-defined]


def test_absent_default_counters_are_absent_and_documented() -> None:
    page = _page()
    docs = (ROOT / "docs" / "dcgm.md").read_text(encoding="utf-8")
    absent = [row for row in _expected() if row["status"].startswith("absent")]
    for row in absent:
        assert row["field"] not in page
        assert row["field"] in docs, f"docs/dcgm.md does not say why {row['field']} is absent"


def test_every_dcgm_field_declares_a_unit_consistent_with_its_scale() -> None:
    """Beyond the defaults: each catalog field's scale converts our base unit into DCGM's."""
    fields = dcgm_fields()
    for field in fields:
        assert field.scale == pytest.approx(FACTOR.get(field.unit, 1.0)), field.name


def test_fields_without_a_dcgm_name_keep_their_own_name_with_dcgm_labels() -> None:
    families = _families(_page())
    dcgm = {f.name for f in dcgm_fields()}
    assert dcgm <= set(families)
    native = set(families) - dcgm
    assert native and all(name.startswith("gpu_") for name in native)
    assert "gpu_temperature_celsius" in native  # the junction sensor has no DCGM field; the others do
    junction = families["gpu_temperature_celsius"].samples  # type: ignore[attr-defined]
    assert {s.labels["sensor"] for s in junction} == {"junction"}
    assert all(set(STANDARD) <= set(s.labels) for s in junction)


def test_labels_are_dcgm_exporters() -> None:
    families = _families(_page())
    util = families["DCGM_FI_DEV_GPU_UTIL"].samples  # type: ignore[attr-defined]
    by_gpu = {s.labels["gpu"]: s.labels for s in util}
    assert list(by_gpu["0"]) == STANDARD
    assert by_gpu["0"] == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "pci_bus_id": "00000000:07:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "hostname": "edge-1",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    assert by_gpu["1"]["device"] == "nvidia1"
    # a MIG instance: its parent's UUID, plus the GPU instance and its profile
    fb = [s.labels for s in families["DCGM_FI_DEV_FB_USED"].samples if "GPU_I_ID" in s.labels]  # type: ignore[attr-defined]
    assert fb == [
        {
            "gpu": "0",
            "UUID": "GPU-aaaa",
            "pci_bus_id": "00000000:07:00.0",
            "device": "nvidia0",
            "modelName": "NVIDIA A100-SXM4-40GB",
            "GPU_I_PROFILE": "1g.10gb",
            "GPU_I_ID": "7",
            "hostname": "edge-1",
            "DCGM_FI_DRIVER_VERSION": "550.54.15",
        }
    ]


def test_pod_labels_when_one_container_uses_the_device() -> None:
    pods = {
        "GPU-aaaa": (PodRef("ml", "trainer-0", "trainer"),),
        "GPU-bbbb": (PodRef("serve", "a", "server"), PodRef("serve", "b", "server")),
    }
    util = _families(_page(pods))["DCGM_FI_DEV_GPU_UTIL"].samples  # type: ignore[attr-defined]
    by_gpu = {s.labels["gpu"]: s.labels for s in util}
    assert (by_gpu["0"]["namespace"], by_gpu["0"]["pod"], by_gpu["0"]["container"]) == ("ml", "trainer-0", "trainer")
    # shared by two pods (time-slicing): no single owner, empty as dcgm-exporter leaves it
    assert (by_gpu["1"]["namespace"], by_gpu["1"]["pod"], by_gpu["1"]["container"]) == ("", "", "")


def test_promtool_finds_only_dcgm_naming_style_complaints() -> None:
    """dcgm-exporter's names break Prometheus naming conventions (counters without _total, camelCase
    labels, a type in DCGM_FI_DEV_PCIE_REPLAY_COUNTER); compatibility needs them. Anything else
    promtool finds is a real problem."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=_page(), capture_output=True, text=True, timeout=30, check=False
    )
    problems = [ln for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
    assert problems  # the checker ran and saw the page
    allowed = (
        'counter metrics should have "_total" suffix',
        "should be written in 'snake_case' not 'camelCase'",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'",
    )
    assert all(any(a in ln for a in allowed) for ln in problems), problems


# --- through the CLI -----------------------------------------------------------------------------


@pytest.fixture
def exporter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """The exporter on simulated GPUs; the fake driver's process PIDs live in a fixture /proc."""
    proc = tmp_path / "proc"
    trainer = (paths.FIXTURES / "k8s" / "proc" / "1001" / "cgroup").read_text()
    for pid in (4000, 4010):  # the simulated driver's one process on GPU 0 and GPU 1
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(trainer)
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "gpu_exporter",
        "--gpu-vendor=fake",
        "--fake.gpus=2",
        f"--web.listen-address=127.0.0.1:{port}",
        "--gpu-metrics-collection-interval=200ms",
        "--node-name=edge-1",
        "--k8s.pod-attribution=true",
        f"--path.procfs={proc}",
        f"--k8s.pod-logs-path={paths.FIXTURES / 'k8s' / 'var' / 'log' / 'pods'}",
        f"--k8s.kubelet-socket={tmp_path / 'none.sock'}",
        *request.param,
    ]
    env = child_env()
    child = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield port, tmp_path
    finally:
        child.terminate()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)


def _scrape_until(port: int, needle: str) -> str:
    # a bound for a failure only: a Python start and the first pod lookup take seconds at a load of 15
    deadline = time.monotonic() + 60
    page = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                page = response.read().decode()
            if needle in page:
                return page
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} never appeared; last page:\n{page[:2000]}")


@pytest.mark.integration
@pytest.mark.parametrize("exporter", [["--metrics.naming=dcgm"]], indirect=True)
def test_cli_serves_the_dcgm_page_with_pod_labels(exporter: tuple[int, Path]) -> None:
    port, _ = exporter
    page = _scrape_until(port, 'pod="trainer-0"')
    util = [ln for ln in page.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert len(util) == 2
    assert all('hostname="edge-1"' in ln and 'namespace="ml"' in ln for ln in util)
    assert "gpu_utilization_ratio" not in page
    assert "gpu_pod_info{" in page  # the per-pod section is appended in either naming


@pytest.mark.integration
@pytest.mark.parametrize("exporter", [[]], indirect=True)
def test_cli_native_page_has_pod_series(exporter: tuple[int, Path]) -> None:
    port, _ = exporter
    page = _scrape_until(port, "gpu_pod_energy_joules_total{")
    info = [ln for ln in page.splitlines() if ln.startswith("gpu_pod_info{")]
    assert len(info) == 2 and all('pod="trainer-0",container="trainer"' in ln for ln in info)
    assert "gpu_pod_memory_used_bytes{" in page and "gpu_utilization_ratio{" in page
    promtool_check(page)  # the appended pod section keeps the whole page valid


def test_cli_rejects_an_unknown_naming() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpu_exporter", "--metrics.naming=prometheus"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "metrics.naming" in result.stderr and "dcgm" in result.stderr
