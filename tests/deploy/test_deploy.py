"""Kubernetes manifests and the Dockerfile: rendered, schema-validated, and checked for the
properties an operator relies on (no GPU taken, never evicted from an offline edge node, locked down).

Rendering uses `kubectl kustomize`; validation uses the `kubernetes-validate` package, which bundles
the Kubernetes JSON schemas and works offline.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpu_exporter import config
from tests.support import kustomize_lite, paths

ROOT = paths.ROOT
DEPLOY = ROOT / "deploy"
KUBECTL = shutil.which("kubectl")
K8S_VERSION = "1.30.0"
OVERLAYS = ("kubeedge", "kubernetes")


def _kubectl_kustomize(path: Path) -> list[dict[str, Any]] | None:
    """Rendered by `kubectl kustomize`; None without a kubectl whose kustomize knows components."""
    if KUBECTL is None:
        return None
    result = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False)
    if result.returncode != 0 and ("components" in result.stderr or "patches" in result.stderr):
        return None  # Debian's kubectl 1.20: its kustomize predates these fields
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _render_path(path: Path) -> list[dict[str, Any]]:
    docs = _kubectl_kustomize(path)
    return docs if docs is not None else kustomize_lite.build(path)


def _render(overlay: str) -> list[dict[str, Any]]:
    return _render_path(DEPLOY / overlay)


def render_with(tmp_path: Path, component: str, overlay: str = "kubeedge") -> list[dict[str, Any]]:
    """The overlay plus one component, as an operator's own kustomization would combine them."""
    where = tmp_path / f"{overlay}-{component}"
    where.mkdir()
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / overlay, where)],
                "components": [os.path.relpath(DEPLOY / "components" / component, where)],
            }
        ),
        encoding="utf-8",
    )
    return _render_path(where)


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, _render(request.param)


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, "DaemonSet")["spec"]["template"]["spec"]
    return spec


def _agent(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["gpu-exporter"]
    agent: dict[str, Any] = containers[0]
    return agent


# --- schema validation -------------------------------------------------------------------------


def test_rendered_manifests_pass_the_kubernetes_schemas(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    _, docs = rendered
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_standalone_manifests_pass_the_kubernetes_schemas() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    checked = 0
    for name in ("servicemonitor.yaml", "secret.example.yaml", "bridge.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")):
            if doc and "." not in doc["apiVersion"].split("/")[0]:  # core and apps kinds only; CRDs below
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
                checked += 1
    assert checked >= 3


def test_schema_validation_rejects_a_broken_daemonset() -> None:
    """The validator is really strict: a typo in a field name is an error."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    doc = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text(encoding="utf-8"))
    doc["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def _key(doc: dict[str, Any]) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def test_fallback_renderer_matches_kubectl(tmp_path: Path) -> None:
    """Where a recent kubectl exists, the Python fallback renders exactly the same resources."""
    overlay = tmp_path / "with-pod-resources"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / "kubernetes", overlay)],
                "components": [os.path.relpath(DEPLOY / "components" / "pod-resources", overlay)],
            }
        ),
        encoding="utf-8",
    )
    for path in [DEPLOY / "base", *(DEPLOY / o for o in OVERLAYS), overlay]:
        ours = kustomize_lite.build(path)
        theirs = _kubectl_kustomize(path)
        if theirs is None:
            pytest.skip("no kubectl with a recent kustomize")
        assert sorted(ours, key=_key) == sorted(theirs, key=_key), path


# --- DaemonSet properties ----------------------------------------------------------------------


def test_no_gpu_is_requested(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    spec = _pod_spec(docs)
    for container in spec["containers"] + spec.get("initContainers", []):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            assert not any("nvidia.com" in key or "gpu" in key for key in resources.get(section, {}))
    env = {e["name"]: e.get("value") for e in _agent(docs)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert spec["runtimeClassName"] == "nvidia"


def test_resources_sized_for_a_small_agent(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    resources = _agent(docs)["resources"]
    assert resources["requests"] == {"cpu": "50m", "memory": "64Mi"}
    assert resources["limits"] == {"cpu": "200m", "memory": "128Mi"}


def test_never_evicted_from_an_unreachable_node(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    tolerations = _pod_spec(docs)["tolerations"]
    for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"):
        match = [t for t in tolerations if t.get("key") == key]
        assert match, f"no toleration for {key}"
        assert match[0]["operator"] == "Exists"
        assert match[0]["effect"] == "NoExecute"
        assert "tolerationSeconds" not in match[0]  # tolerated forever


def test_kubeedge_placement(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    """Which nodes, label by label: tests/deploy/test_deploy_placement.py. Here: the expressions' form."""
    overlay, docs = rendered
    spec = _pod_spec(docs)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # The architectures the image's manifest list holds (the only In), then the GPU label:
    # Exists, never `accelerator=nvidia` equality, which misses nodes labelled otherwise; the only
    # values are those excluded (accelerator=amd is the AMD component's).
    assert all(term["matchExpressions"][0]["key"] == "kubernetes.io/arch" for term in terms)
    assert all(term["matchExpressions"][0]["operator"] == "In" for term in terms)
    expressions = [e for term in terms for e in term["matchExpressions"][1:]]
    assert all(e["operator"] == "Exists" or e["operator"] == "NotIn" for e in expressions)
    assert all(term["matchExpressions"][1]["operator"] == "Exists" for term in terms)
    toleration_keys = {(t.get("key"), t.get("value")) for t in spec["tolerations"]}
    if overlay == "kubeedge":
        assert spec["nodeSelector"] == {"node-role.kubernetes.io/edge": ""}
        assert ("node-role.kubernetes.io/edge", None) in toleration_keys
        assert ("dedicated", "edge") in toleration_keys
    else:
        assert "nodeSelector" not in spec
        assert ("dedicated", "edge") not in toleration_keys


def test_host_network_and_node_name(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = rendered
    spec = _pod_spec(docs)
    assert spec["hostNetwork"] is True
    # edge nodes resolve with the host's resolver (cluster DNS may be out of reach); others via the cluster
    assert spec["dnsPolicy"] == ("Default" if overlay == "kubeedge" else "ClusterFirstWithHostNet")
    node_name = [e for e in _agent(docs)["env"] if e["name"] == "NODE_NAME"]
    assert node_name[0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_locked_down(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    spec = _pod_spec(docs)
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for container in spec["containers"] + spec.get("initContainers", []):
        ctx = container["securityContext"]
        assert ctx["readOnlyRootFilesystem"] is True
        assert ctx["allowPrivilegeEscalation"] is False
        assert ctx["capabilities"]["drop"] == ["ALL"]
        assert not ctx.get("privileged", False)
    # Only the init container that hands the spool to the agent's user runs as root, with CHOWN only.
    for init in spec.get("initContainers", []):
        assert init["securityContext"]["capabilities"].get("add", []) == ["CHOWN"]
        assert str(spec["securityContext"]["runAsUser"]) in " ".join(init["command"])
    assert "add" not in _agent(docs)["securityContext"]["capabilities"]


def test_probes(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    agent = _agent(docs)
    ports = {p["name"]: p["containerPort"] for p in agent["ports"]}
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert agent[probe]["httpGet"]["port"] in ports


def test_spool_on_a_host_path(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    spec = _pod_spec(docs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in _agent(docs)["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in _agent(docs)["env"]}
    spool_dir = env[config.env_name("spool.dir")]
    mount = next(path for path in mounts if spool_dir.startswith(path.rstrip("/") + "/"))
    assert "hostPath" in volumes[mounts[mount]]
    # every other writable path is memory-backed and bounded (the root filesystem is read-only)
    for name in mounts.values():
        volume = volumes[name]
        if "emptyDir" in volume:
            assert volume["emptyDir"]["sizeLimit"]


def test_rolling_update_one_node_at_a_time(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    strategy = _one(docs, "DaemonSet")["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    assert strategy["rollingUpdate"]["maxUnavailable"] == 1


def test_config_from_configmap_and_credentials_from_secret(
    rendered: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    _, docs = rendered
    spec = _pod_spec(docs)
    configmap = _one(docs, "ConfigMap")
    volume = next(v for v in spec["volumes"] if "configMap" in v)
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    mount = next(m for m in _agent(docs)["volumeMounts"] if m["name"] == volume["name"])
    assert f"--config.file={mount['mountPath']}/config.yaml" in _agent(docs)["args"]
    # the agent itself accepts the file: every key is a known option with a valid value
    path = tmp_path / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"], encoding="utf-8")
    # (forwarding's certificate files live on each node: tests/deploy/test_deploy_cloud.py loads it with them)
    loaded = config.load({"config.file": str(path), "mqtt.url": ""}, environ={})
    assert loaded.path_procfs == "/host/proc"
    # what pod attribution reads is mounted, read-only, from the host
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in _agent(docs)["volumeMounts"]}
    pod_logs = Path(loaded.k8s_pod_logs_path)
    for path, host in (
        (loaded.path_procfs, "/proc"),
        (str(pod_logs), "/var/log/pods"),
        (str(pod_logs.parent / "containers"), "/var/log/containers"),
    ):
        assert mounts[path]["readOnly"] is True
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == host
    secret = yaml.safe_load((DEPLOY / "secret.example.yaml").read_text(encoding="utf-8"))
    for env in _agent(docs)["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
            assert ref["optional"] is True
            assert env["name"] in {config.env_name(o.name) for o in config.OPTIONS}
    # the password file comes from the same Secret, mounted read-only
    volume = next(v for v in spec["volumes"] if "secret" in v)
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["optional"] is True
    assert {item["key"] for item in volume["secret"]["items"]} <= set(secret["stringData"])
    mount = next(m for m in _agent(docs)["volumeMounts"] if m["name"] == volume["name"])
    assert mount["readOnly"] is True
    url = yaml.safe_load(configmap["data"]["config.yaml"]).get("mqtt.url")
    if url:
        assert url.startswith("mqtts://")  # KubeEdge: straight to the cloud broker, over TLS
        assert loaded.spool_max_bytes <= 1 << 30


def test_pod_resources_component_is_opt_in(tmp_path: Path) -> None:
    """By default no overlay mounts the kubelet's root-only socket (the agent stays non-root); the
    component adds the mount and root, and keeps everything else locked down."""
    for overlay in OVERLAYS:
        mounts = {m["mountPath"] for m in _agent(_render(overlay))["volumeMounts"]}
        assert "/var/lib/kubelet/pod-resources" not in mounts
    docs = render_with(tmp_path, "pod-resources", "kubernetes")
    agent = _agent(docs)
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == "/var/lib/kubelet/pod-resources")
    assert mount["readOnly"] is True
    # the CDI specs DRA drivers write, where the agent's default k8s.cdi-spec-dirs looks for them
    cdi = {m["mountPath"]: m for m in agent["volumeMounts"] if m["mountPath"] in ("/etc/cdi", "/var/run/cdi")}
    assert set(cdi) == set(config.Config().k8s_cdi_spec_dirs) and all(m["readOnly"] for m in cdi.values())
    configmap = _one(docs, "ConfigMap")
    assert "k8s.kubelet-socket: /var/lib/kubelet/pod-resources/kubelet.sock" in configmap["data"]["config.yaml"]
    ctx = agent["securityContext"]
    assert ctx["runAsUser"] == 0
    assert ctx["capabilities"]["drop"] == ["ALL"] and "add" not in ctx["capabilities"]
    assert ctx["readOnlyRootFilesystem"] is True and ctx["allowPrivilegeEscalation"] is False
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --- Service and ServiceMonitor ----------------------------------------------------------------


def test_service_monitor_selects_the_agent() -> None:
    docs = [d for d in yaml.safe_load_all((DEPLOY / "servicemonitor.yaml").read_text(encoding="utf-8")) if d]
    service, monitor = _one(docs, "Service"), _one(docs, "ServiceMonitor")
    daemonset = yaml.safe_load((DEPLOY / "base" / "daemonset.yaml").read_text(encoding="utf-8"))
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
    container_ports = {p["name"] for p in daemonset["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


# --- prometheus-adapter and Grafana: the queries are valid PromQL on metrics we serve ----------


def _promql_is_valid(tmp_path: Path, exprs: dict[str, str]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    rules = [{"record": f"check:{i}", "expr": e} for i, e in enumerate(exprs.values())]
    path = tmp_path / "exprs.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{list(exprs)}"


def _known_metric_names() -> set[str]:
    from gpu_exporter import catalog
    from gpu_exporter.k8s import render

    return {m.name for m in catalog.CATALOG} | set(render.FAMILIES) | {"gpu_info", "gpu_up"}


def test_prometheus_adapter_rule_is_valid_promql(tmp_path: Path) -> None:
    values = yaml.safe_load((DEPLOY / "prometheus-adapter" / "values.yaml").read_text(encoding="utf-8"))
    exprs = {}
    assert len(values["rules"]["custom"]) == 2
    for rule in values["rules"]["custom"]:
        series = re.match(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)", rule["seriesQuery"])
        assert series and series.group(1) in _known_metric_names()
        assert {"namespace", "pod"} <= set(rule["resources"]["overrides"])
        query = (
            rule["metricsQuery"]
            .replace("<<.Series>>", series.group(1))
            .replace("<<.LabelMatchers>>", 'namespace="default",pod=~"web-.*"')
            .replace("<<.GroupBy>>", "namespace,pod")
        )
        exprs[rule["name"]["as"]] = query
    _promql_is_valid(tmp_path, exprs)


def test_grafana_dashboard_queries_are_valid(tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "gpu-exporter.json").read_text(encoding="utf-8"))
    exprs: dict[str, str] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var in ("$__rate_interval", "$__interval", "$__range"):
                expr = expr.replace(var, "5m")
            expr = re.sub(r"\$\{?(\w+)\}?", "x", expr)  # template variables
            exprs[f"{panel['title']}: {target['expr']}"] = expr
    assert len(exprs) >= 8
    _promql_is_valid(tmp_path, exprs)
    used = set(re.findall(r"\b(gpu_[a-z0-9_]+)", " ".join(exprs.values())))
    assert used <= _known_metric_names() | {n for n in used if n.startswith("gpu_exporter_")}


# --- Dockerfile --------------------------------------------------------------------------------


def _dockerfile_stages() -> list[list[tuple[str, str]]]:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    text = re.sub(r"\\\n", " ", text)  # join continuation lines
    stages: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, rest = line.partition(" ")
        if instruction.upper() == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((instruction.upper(), rest.strip()))
    return stages


def test_dockerfile_is_multi_stage_slim_and_non_root() -> None:
    stages = _dockerfile_stages()
    assert len(stages) >= 2
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    base = re.search(r"ARG PYTHON_IMAGE=(\S+)", text)
    assert base and "slim" in base.group(1)
    final = stages[-1]
    users = [rest for ins, rest in final if ins == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    entry = [rest for ins, rest in final if ins == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["gpu-exporter"]
    # the entrypoint is the CLI this project installs
    assert 'gpu-exporter = "gpu_exporter.cli:entry"' in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    labels = " ".join(rest for ins, rest in final if ins == "LABEL")
    for key in ("title", "version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    # the final stage copies the built environment from an earlier stage and compiles nothing
    assert any(ins == "COPY" and rest.startswith("--from=build") for ins, rest in final)
    final_runs = " ".join(rest for ins, rest in final if ins == "RUN")
    for tool in ("gcc", "build-essential", "g++", "make ", "apt-get install", "pip install"):
        assert tool not in final_runs
    # architecture-independent: nothing pins a platform or an amd64-only path
    assert "--platform" not in " ".join(rest for stage in stages for ins, rest in stage if ins == "FROM")
    assert "x86_64" not in text and "amd64" not in re.sub(r"#.*", "", text)


def test_dockerignore_keeps_the_context_small() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()]
    assert lines[lines.index("*")] == "*"
    copied = {
        source
        for stage in _dockerfile_stages()
        for ins, rest in stage
        if ins == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    }
    allowed = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    for source in copied:
        assert source.rstrip("/") in allowed or source.split("/")[0] in allowed
    for source in ("pyproject.toml", "src"):
        assert (ROOT / source).exists()


def test_single_file_daemonset_is_the_rendered_kubeedge_overlay() -> None:
    """deploy/daemonset.yaml (for kubectl apply -f) must match what the kustomizations render."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("render_deploy", ROOT / "tools" / "render_deploy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "deploy" / "daemonset.yaml").read_text() == module.render(), (
        "deploy/daemonset.yaml is stale: run python tools/render_deploy.py"
    )
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "daemonset.yaml").read_text()) if d]
    assert "DaemonSet" in {d["kind"] for d in docs}
