"""The per-vendor kustomize components (AMD, Jetson processes) and the AMD library errors they answer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_deploy import DEPLOY, K8S_VERSION, render_with
from tests.deploy.test_deploy import _pod_spec as pod_spec
from tests.support import SRC
from tests.unit.backends.amd.test_amd import open_amd_in_child


def validate(docs: list[dict[str, Any]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("overlay", ["kubeedge", "kubernetes"])
def test_amd_component_mounts_what_amd_smi_needs(tmp_path: Path, overlay: str) -> None:
    docs = render_with(tmp_path, "amd", overlay)
    validate(docs)
    spec = pod_spec(docs)
    agent = spec["containers"][0]
    assert "runtimeClassName" not in spec  # AMD nodes have no nvidia runtime handler
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in agent["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in agent["env"]}
    rocm = mounts[env["ROCM_PATH"]]
    assert rocm["readOnly"] is True and volumes[rocm["name"]]["hostPath"]["path"] == "/opt/rocm"
    assert volumes[mounts["/dev/kfd"]["name"]]["hostPath"] == {"path": "/dev/kfd", "type": "CharDevice"}
    assert volumes[mounts["/dev/dri"]["name"]]["hostPath"]["path"] == "/dev/dri"
    ctx = agent["securityContext"]
    # privileged only for the device cgroup: still non-root, no capabilities, read-only root
    assert ctx["privileged"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert ctx["capabilities"] == {"drop": ["ALL"]} and ctx["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["supplementalGroups"]


def test_jetson_processes_component_adds_exactly_the_capabilities_to_read_fds(tmp_path: Path) -> None:
    docs = render_with(tmp_path, "jetson-processes")
    validate(docs)
    ctx = pod_spec(docs)["containers"][0]["securityContext"]
    assert ctx["runAsUser"] == 0
    assert sorted(ctx["capabilities"]["add"]) == ["DAC_READ_SEARCH", "SYS_PTRACE"]
    assert ctx["capabilities"]["drop"] == ["ALL"]
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    assert not ctx.get("privileged", False)


def test_default_manifest_mounts_the_hosts_sysfs_for_path_sysfs() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text(encoding="utf-8")) if d]
    spec = pod_spec(docs)
    agent = spec["containers"][0]
    flag = next(a for a in agent["args"] if a.startswith("--path.sysfs="))
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == flag.partition("=")[2])
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert mount["readOnly"] is True and volume["hostPath"]["path"] == "/sys"


SHIM = """\
import ctypes
ctypes.CDLL(None).amdsmi_get_gpu_metrics_info_v99  # a symbol this host's library lacks
"""


def test_amdsmi_newer_than_the_hosts_library_is_one_line(tmp_path: Path) -> None:
    """The package binds the library's symbols at import; one the host's older ROCm lacks is named."""
    (tmp_path / "amdsmi").mkdir()
    (tmp_path / "amdsmi" / "__init__.py").write_text(SHIM)
    lines = open_amd_in_child(os.pathsep.join([str(tmp_path), str(SRC)]))
    assert len(lines) == 1 and lines[0].startswith("ERR AMD SMI library libamd_smi.so lacks a function"), lines
    assert "--build-arg AMDSMI=amdsmi==" in lines[0]
