"""Which nodes the rendered DaemonSets land on, and that no shipped manifest touches another stack.

Placement is checked as the scheduler decides it (nodeSelector, then the required node-affinity
terms, ORed, with In/NotIn/Exists/DoesNotExist expressions ANDed), on nodes labelled the way the tools
of each vendor label them:

- NVIDIA GPU operator: ``nvidia.com/gpu.present=true``, and NFD with vendor-only PCI labels
  (``feature.node.kubernetes.io/pci-10de.present``); GPU feature discovery: ``nvidia.com/gpu.family``,
  ``.product``, ``.count``; plain NFD: ``pci-<class>_<vendor>.present`` (``pci-0302_10de``);
- AMD GPU operator: ``feature.node.kubernetes.io/amd-gpu=true`` (its NFD rule), ``amd-vgpu`` for
  virtual functions; AMD's node labeller: ``amd.com/gpu.family``, ``.device-id``, ``.product-name``;
  plain NFD: ``pci-0380_1002.present`` (Instinct MI100-MI250), ``pci-1200_1002.present`` (MI300);
- Jetson: GPU feature discovery where the device plugin runs in Tegra mode (its CUDA-based labeller:
  ``nvidia.com/gpu.family``, ``.product``, ``.count``), NFD with deploy/nfd-jetson.yaml's rule
  (``feature.node.kubernetes.io/nvidia-jetson``), else a label by hand.

Every node carries the kubelet's ``kubernetes.io/arch``: only the architectures the image's manifest list
holds (tools/image.py) may be selected, or a node of another would fail to pull it.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_deploy import DEPLOY, _pod_spec, _render, render_with
from tests.support import ROOT

EDGE = {"node-role.kubernetes.io/edge": "", "node-role.kubernetes.io/agent": ""}


def _node(labels: dict[str, str], arch: str = "amd64") -> dict[str, str]:
    """A node's labels as the kubelet adds its own to what the tools set."""
    return {"kubernetes.io/arch": arch, "kubernetes.io/os": "linux", **labels}


# Node Feature Discovery's default kernel labels on a Jetson (Jetson Linux names its kernels -tegra)
JETSON_KERNEL = {
    "feature.node.kubernetes.io/kernel-version.full": "5.15.148-tegra",
    "feature.node.kubernetes.io/kernel-version.major": "5",
}
NVIDIA_NODES = {
    "gpu-operator": _node({"nvidia.com/gpu.present": "true", "feature.node.kubernetes.io/pci-10de.present": "true"}),
    "gpu-feature-discovery": _node(
        {"nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.product": "NVIDIA-A2", "nvidia.com/gpu.count": "1"}
    ),
    "nfd-default-3d-controller": _node({"feature.node.kubernetes.io/pci-0302_10de.present": "true"}),
    "nfd-default-vga": _node({"feature.node.kubernetes.io/pci-0300_10de.present": "true"}),
    "grace-hopper-gpu-operator": _node({"nvidia.com/gpu.present": "true"}, "arm64"),
    "jetson-gfd-tegra": _node(
        {"nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.product": "Orin", "nvidia.com/gpu.count": "1"}, "arm64"
    ),
    "jetson-nfd-rule": _node({"feature.node.kubernetes.io/nvidia-jetson": "true", **JETSON_KERNEL}, "arm64"),
    "jetson-by-hand": _node({"accelerator": "jetson-orin"}, "arm64"),
    "nvidia-by-hand": _node({"accelerator": "nvidia-tesla-t4"}),
}
AMD_NODES = {
    "amd-gpu-operator": _node(
        {"feature.node.kubernetes.io/amd-gpu": "true", "feature.node.kubernetes.io/pci-1002.present": "true"}
    ),
    "amd-gpu-operator-vf": _node({"feature.node.kubernetes.io/amd-vgpu": "true"}),
    "amd-node-labeller": _node(
        {
            "amd.com/gpu.family": "AI",
            "amd.com/gpu.device-id": "740f",
            "amd.com/gpu.product-name": "AMD_Instinct_MI210",
        }
    ),
    "nfd-default-instinct": _node({"feature.node.kubernetes.io/pci-0380_1002.present": "true"}),
    "nfd-default-mi300": _node({"feature.node.kubernetes.io/pci-1200_1002.present": "true"}),
    "amd-by-hand": _node({"accelerator": "amd"}),
}
NO_GPU = {
    "cpu-only": _node({}),
    "amd-cpu-nfd": _node({"feature.node.kubernetes.io/pci-0300_1a03.present": "true"}),  # an ASPEED BMC's VGA
    "arm64-cpu-only-nfd": _node({"feature.node.kubernetes.io/kernel-version.full": "6.1.0-18-arm64"}, "arm64"),
    # an NVIDIA GPU, but an architecture the image has no entry for: ErrImagePull if scheduled
    "power9-gpu-operator": _node({"nvidia.com/gpu.present": "true"}, "ppc64le"),
    "power9-amd-by-hand": _node({"accelerator": "amd"}, "ppc64le"),
    # the Jetson rule's label on a machine that cannot be a Jetson
    "amd64-with-the-jetson-label": _node({"feature.node.kubernetes.io/nvidia-jetson": "true"}),
}


def _expression_matches(expr: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    raise AssertionError(f"operator {op} not modelled")


def schedules(spec: dict[str, Any], labels: dict[str, str]) -> bool:
    """The scheduler's node filter for this pod spec (taints aside: the tolerations are checked below)."""
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return any(
        all(_expression_matches(e, labels) for e in term.get("matchExpressions", []))
        for term in required["nodeSelectorTerms"]
    )


def test_the_model_of_the_scheduler_is_strict() -> None:
    spec = {
        "nodeSelector": {"role": ""},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
                        {
                            "matchExpressions": [
                                {"key": "b", "operator": "Exists"},
                                {"key": "b", "operator": "NotIn", "values": ["x"]},
                            ]
                        },
                    ]
                }
            }
        },
    }
    assert schedules(spec, {"role": "", "a": "1"})
    assert not schedules(spec, {"role": "yes", "a": "1"})  # nodeSelector is an equality
    assert schedules(spec, {"role": "", "b": "y"})
    assert not schedules(spec, {"role": "", "b": "x"})  # expressions of a term are ANDed
    assert not schedules(spec, {"role": "", "c": "1"})


@pytest.fixture(scope="module")
def placements(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """(overlay, vendor) -> the rendered pod spec: the overlays as shipped, and with the AMD component."""
    tmp = tmp_path_factory.mktemp("placement")
    out = {}
    for overlay in ("kubeedge", "kubernetes"):
        out[(overlay, "nvidia")] = _pod_spec(_render(overlay))
        where = tmp / overlay
        where.mkdir()
        out[(overlay, "amd")] = _pod_spec(render_with(where, "amd", overlay))
    return out


@pytest.mark.parametrize("overlay", ["kubeedge", "kubernetes"])
@pytest.mark.parametrize("node", sorted(NVIDIA_NODES))
def test_nvidia_and_jetson_nodes_get_the_nvidia_daemonset_only(
    placements: dict[tuple[str, str], dict[str, Any]], overlay: str, node: str
) -> None:
    labels = dict(NVIDIA_NODES[node], **(EDGE if overlay == "kubeedge" else {}))
    assert schedules(placements[(overlay, "nvidia")], labels)
    assert not schedules(placements[(overlay, "amd")], labels)


@pytest.mark.parametrize("overlay", ["kubeedge", "kubernetes"])
@pytest.mark.parametrize("node", sorted(AMD_NODES))
def test_amd_nodes_get_the_amd_daemonset_only(
    placements: dict[tuple[str, str], dict[str, Any]], overlay: str, node: str
) -> None:
    labels = dict(AMD_NODES[node], **(EDGE if overlay == "kubeedge" else {}))
    assert schedules(placements[(overlay, "amd")], labels)
    assert not schedules(placements[(overlay, "nvidia")], labels)


@pytest.mark.parametrize("node", sorted(NO_GPU))
def test_nodes_without_a_gpu_get_neither(placements: dict[tuple[str, str], dict[str, Any]], node: str) -> None:
    for (overlay, _), spec in placements.items():
        labels = dict(NO_GPU[node], **(EDGE if overlay == "kubeedge" else {}))
        assert not schedules(spec, labels)


def _image_arches() -> tuple[str, ...]:
    """The platforms tools/image.py puts in the manifest list."""
    spec = importlib.util.spec_from_file_location("image_tool_arches", ROOT / "tools" / "image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["image_tool_arches"] = module
    spec.loader.exec_module(module)
    return tuple(module.ARCHES)


def test_every_term_names_the_architectures_of_the_images_manifest_list(
    placements: dict[tuple[str, str], dict[str, Any]],
) -> None:
    arches = set(_image_arches())
    assert arches == {"amd64", "arm64"}
    for (overlay, vendor), spec in placements.items():
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        for term in terms:
            arch = [e for e in term["matchExpressions"] if e["key"] == "kubernetes.io/arch"]
            assert len(arch) == 1 and arch[0]["operator"] == "In", (overlay, vendor, term)
            assert set(arch[0]["values"]) <= arches, (overlay, vendor, term)


def test_the_daemonsets_image_is_one_tag_for_every_architecture(
    placements: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """A node pulls its own platform's entry of the manifest list: the manifests name the tag, never one
    architecture's image (a digest or an -amd64 / -arm64 tag)."""
    for spec in placements.values():
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            image = container["image"]
            assert re.fullmatch(r"[\w.\-/]+/gpu-exporter:[\w.\-]+", image), image
            assert "@" not in image and not image.endswith(("-amd64", "-arm64", "-aarch64")), image


def _jetson_rule() -> dict[str, Any]:
    doc = yaml.safe_load((DEPLOY / "nfd-jetson.yaml").read_text(encoding="utf-8"))
    assert doc["kind"] == "NodeFeatureRule" and doc["apiVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    return doc["spec"]["rules"][0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "release, jetson",
    [
        ("5.10.120-tegra", True),  # L4T 35 (JetPack 5)
        ("5.15.148-tegra", True),  # L4T 36 (JetPack 6)
        ("6.8.12-tegra", True),  # L4T 38-39 (JetPack 7: Thor, Orin on 7.2)
        ("6.8.12-tegra-rt", True),  # a rebuilt Jetson kernel keeps the suffix
        ("6.8.0-1013-nvidia-64k", False),  # Ubuntu's NVIDIA kernel on Grace: not a Jetson
        ("6.1.0-18-arm64", False),
        ("5.15.0-91-generic", False),
    ],
)
def test_the_nfd_rule_labels_jetson_kernels_only(release: str, jetson: bool) -> None:
    """NFD's InRegexp is a Go regexp search on the value; the same pattern as a Python search."""
    rule = _jetson_rule()
    [term] = rule["matchFeatures"]
    assert term["feature"] == "kernel.version"
    expression = term["matchExpressions"]["full"]
    assert expression["op"] == "InRegexp"
    assert any(re.search(pattern, release) for pattern in expression["value"]) is jetson


def test_the_nfd_rules_label_is_the_one_the_placement_selects(
    placements: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """NFD prefixes a rule's label without a namespace with feature.node.kubernetes.io/."""
    [(name, value)] = _jetson_rule()["labels"].items()
    labels = _node({f"feature.node.kubernetes.io/{name}": value, **JETSON_KERNEL}, "arm64")
    for overlay in ("kubeedge", "kubernetes"):
        node = dict(labels, **(EDGE if overlay == "kubeedge" else {}))
        assert schedules(placements[(overlay, "nvidia")], node)
        assert not schedules(placements[(overlay, "amd")], node)
    assert not schedules(placements[("kubernetes", "nvidia")], dict(labels, **{"kubernetes.io/arch": "amd64"}))


def test_kubeedge_needs_the_edge_role_and_kubernetes_does_not(
    placements: dict[tuple[str, str], dict[str, Any]],
) -> None:
    cloud_gpu_node = NVIDIA_NODES["gpu-operator"]
    assert not schedules(placements[("kubeedge", "nvidia")], cloud_gpu_node)
    assert not schedules(placements[("kubeedge", "amd")], AMD_NODES["amd-gpu-operator"])
    assert schedules(placements[("kubernetes", "nvidia")], cloud_gpu_node)


def test_gpu_taints_are_tolerated(placements: dict[tuple[str, str], dict[str, Any]]) -> None:
    for (_, vendor), spec in placements.items():
        tolerated = {t.get("key") for t in spec["tolerations"] if t.get("operator") == "Exists"}
        assert ("amd.com/gpu" if vendor == "amd" else "nvidia.com/gpu") in tolerated


# --- no shipped manifest defines an object of another stack ---------------------------------------

OWN_NAMESPACE = "gpu-exporter"
OWN_PREFIX = "gpu-exporter"
KUSTOMIZE_KINDS = {"Kustomization", "Component"}


def _shipped_objects() -> list[tuple[str, dict[str, Any]]]:
    """Every Kubernetes object in deploy/, as files and as the overlays render them (with each component)."""
    objects = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if "helm" in path.relative_to(DEPLOY).parts:
            continue  # Go templates, not manifests: what Helm renders is checked in test_helm_chart.py
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if isinstance(doc, dict) and "kind" in doc and "apiVersion" in doc and doc["kind"] not in KUSTOMIZE_KINDS:
                objects.append((str(path.relative_to(DEPLOY)), doc))
    for overlay in ("kubeedge", "kubernetes"):
        objects += [(f"rendered {overlay}", doc) for doc in _render(overlay)]
    return objects


def foreign(doc: dict[str, Any]) -> str | None:
    """Why ``doc`` would change something the project does not own, or None."""
    meta = doc.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), meta.get("namespace")
    if not name.startswith(OWN_PREFIX):
        return f"{doc['kind']} {namespace or ''}/{name}: the name is not the project's ({OWN_PREFIX}...)"
    if doc["kind"] != "Namespace" and namespace not in (None, OWN_NAMESPACE):
        return f"{doc['kind']} {namespace}/{name}: namespace {namespace!r} is not the project's"
    return None


def test_the_ownership_check_sees_another_stacks_object() -> None:
    adapter_config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "adapter-config"}}
    adapter_config["metadata"]["namespace"] = "monitoring"
    assert foreign(adapter_config) is not None
    ours_elsewhere = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpu-exporter-x"}}
    ours_elsewhere["metadata"]["namespace"] = "kube-system"
    assert foreign(ours_elsewhere) is not None
    assert foreign({"kind": "Namespace", "metadata": {"name": "gpu-exporter"}}) is None


def test_no_shipped_manifest_defines_an_object_of_another_stack() -> None:
    objects = _shipped_objects()
    assert len(objects) >= 10
    problems = [f"{where}: {why}" for where, doc in objects if (why := foreign(doc)) is not None]
    assert problems == []


def test_component_renders_own_only(tmp_path: Path) -> None:
    for component in sorted(p.name for p in (DEPLOY / "components").iterdir()):
        where = tmp_path / component
        where.mkdir()
        docs = render_with(where, component)
        assert [why for doc in docs if (why := foreign(doc)) is not None] == []
