"""The Helm chart (deploy/helm/gpu-exporter) through Helm's own code: lint, install, package.

Helm's library comes with the `helm-sdkpy` wheel, which needs Python 3.12: ``.ci/run`` makes a venv with
it and names its interpreter in ``GPU_EXPORTER_HELM_PYTHON`` (or ``none``, with a line saying why, where
the machine has no Python 3.12). ``run_jobs`` starts one stand-in API server per install
(tests/support/kube_apiserver.py), runs tools/helm_chart.py once for every job in that interpreter, and
hands back each job's result with, for an install, the objects Helm sent.

``chart_objects`` drops what Helm itself adds to every object it installs (its release Secret, the labels
``app.kubernetes.io/managed-by`` and the chart's ``helm.sh/chart``, ``app.kubernetes.io/instance`` and
``app.kubernetes.io/version``, the ``meta.helm.sh/*`` annotations), so that a render compares with
kustomize's object for object.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from .kube_apiserver import ApiServer
from .paths import ROOT

__all__ = ["CHART", "EXAMPLES", "Job", "chart_objects", "helm_python", "load_values", "run_jobs"]

CHART = ROOT / "deploy" / "helm" / "gpu-exporter"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
DRIVER = ROOT / "tools" / "helm_chart.py"
ENV = "GPU_EXPORTER_HELM_PYTHON"
DEFAULT_VENV = Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-exporter-ci-py312"
NAMESPACE = "gpu-exporter"
HELM_LABELS = (
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)


def helm_python() -> str:
    """The Python 3.12 interpreter that has helm-sdkpy; a skip (a failure in CI) when there is none."""
    named = os.environ.get(ENV, "")
    if named == "none":
        pytest.skip("not applicable here: no Python 3.12 for helm-sdkpy on this machine (.ci/run said so)")
    candidate = Path(named) if named else DEFAULT_VENV / "bin" / "python"
    if not candidate.is_file():
        pytest.skip(f"no Python 3.12 with helm-sdkpy: set {ENV} or run .ci/run, which makes {DEFAULT_VENV}")
    return str(candidate)


@dataclass
class Job:
    op: str  # lint, install, package
    values: dict[str, Any] | None = None
    result: dict[str, Any] = field(default_factory=dict)
    objects: list[dict[str, Any]] = field(default_factory=list)  # an install's objects, as Helm sent them

    @property
    def error(self) -> str | None:
        error = self.result.get("error")
        return str(error) if error is not None else None

    @property
    def notes(self) -> str:
        notes: str = self.result["release"]["info"].get("notes", "")
        return notes


def run_jobs(jobs: list[Job], workdir: Path, timeout: float = 300) -> list[Job]:
    """Every job in one run of Helm; fills in each job's result (and an install's objects)."""
    python = helm_python()
    servers: dict[int, ApiServer] = {}
    specs: list[dict[str, Any]] = []
    try:
        for i, job in enumerate(jobs):
            spec: dict[str, Any] = {"op": job.op, "values": job.values}
            if job.op == "install":
                server = servers[i] = ApiServer().__enter__()
                spec.update(
                    kubeconfig=str(server.kubeconfig(workdir / f"kubeconfig-{i}", NAMESPACE)), namespace=NAMESPACE
                )
            elif job.op == "package":
                spec["dest"] = str(workdir / "package")
            specs.append(spec)
        (workdir / "jobs.json").write_text(json.dumps(specs), encoding="utf-8")
        proc = subprocess.run(
            [python, str(DRIVER), "jobs", str(workdir / "jobs.json")],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert proc.returncode == 0, f"{DRIVER.name} jobs failed ({proc.returncode}): {proc.stderr[-3000:]}"
        for i, (job, result) in enumerate(zip(jobs, json.loads(proc.stdout), strict=True)):
            job.result = result
            if i in servers:
                job.objects = servers[i].created
    finally:
        for server in servers.values():
            server.__exit__(None, None, None)
    return jobs


def chart_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chart's objects of an install, without Helm's release record and Helm's own marks."""
    out = []
    for obj in objects:
        meta = obj.get("metadata", {})
        if obj.get("kind") == "Secret" and meta.get("labels", {}).get("owner") == "helm":
            continue  # the release record Helm keeps (sh.helm.release.v1.<release>.v<n>)
        obj = json.loads(json.dumps(obj))
        meta = obj["metadata"]
        for key in HELM_LABELS:
            meta.get("labels", {}).pop(key, None)
        for key in list(meta.get("annotations", {})):
            if key.startswith("meta.helm.sh/"):
                del meta["annotations"][key]
        for key in ("labels", "annotations"):
            if key in meta and not meta[key]:
                del meta[key]
        out.append(obj)
    return out


def load_values(path: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return values
