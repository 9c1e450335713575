"""The shipped deployment, run for real on 127.0.0.1: the agent a KubeEdge node would run, and the cloud
broker of deploy/cloud-broker.

``Manifest.load()`` reads deploy/daemonset.yaml (the rendered KubeEdge overlay, what users apply):
the agent container's args, env and mounts, and the ConfigMap's config.yaml. ``node_agent`` turns it
into the command line, environment and files of a test node, swapping only addresses, credentials and
the GPU vendor (plus faster timings where a test asks for them). Paths are mapped as the pod sees them:
a path under a hostPath mount lives in the test node's host directory (``<node>/host/...``, except
``/proc``, which is this machine's), anything else (the ConfigMap) under ``<node>/pod/...``.

``CloudBroker`` runs deploy/cloud-broker/mosquitto.conf with its two listeners on free ports and its
certificate, ACL, password and data paths in a test directory; the bridge's user on the in-cluster
listener gets a password there (``credentials``).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import pytest
import yaml

from . import paths
from .agent_proc import Proc
from .bridge_helpers import BridgeProcess
from .mosquitto import MOSQUITTO_PASSWD, Broker, Collector, make_tls, wait_until
from .procs import child_env, exporter_cmd
from .tcp_proxy import TcpProxy
from .tsdb import MosquittoServer, PrometheusServer, Server, VictoriaMetricsServer, free_port

ROOT = paths.ROOT
DAEMONSET = ROOT / "deploy" / "daemonset.yaml"
CLOUD_BROKER = ROOT / "deploy" / "cloud-broker"


@dataclass
class Manifest:
    config: dict[str, Any]  # the ConfigMap's config.yaml
    args: list[str]
    env: list[dict[str, Any]]
    mounts: dict[str, dict[str, Any]]  # container mountPath -> its volume

    @classmethod
    def load(cls, path: Path = DAEMONSET) -> Manifest:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
        (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
        spec = daemonset["spec"]["template"]["spec"]
        (agent,) = [c for c in spec["containers"] if c["name"] == "gpu-exporter"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        return cls(
            config=yaml.safe_load(configmap["data"]["config.yaml"]),
            args=list(agent.get("args", [])),
            env=list(agent.get("env", [])),
            mounts={m["mountPath"]: volumes[m["name"]] for m in agent["volumeMounts"]},
        )

    def host_path(self, container_path: str) -> str | None:
        """Where a path of the pod lives on the node, or None when no hostPath volume holds it."""
        for mount in sorted(self.mounts, key=len, reverse=True):
            if container_path == mount or container_path.startswith(mount.rstrip("/") + "/"):
                volume = self.mounts[mount]
                if "hostPath" not in volume:
                    return None
                return volume["hostPath"]["path"].rstrip("/") + container_path[len(mount.rstrip("/")) :]
        return None


class NodePaths:
    """A test node's filesystem: the host's paths under ``<root>/host``, the pod's own under ``<root>/pod``."""

    def __init__(self, manifest: Manifest, root: Path) -> None:
        self.manifest = manifest
        self.root = root

    def host(self, host_path: str) -> Path:
        return self.root / "host" / host_path.lstrip("/")

    def local(self, container_path: str) -> str:
        host = self.manifest.host_path(container_path)
        if host is not None and (host == "/proc" or host.startswith("/proc/")):
            return host  # this machine's procfs stands for the node's
        path = self.host(host) if host is not None else self.root / "pod" / container_path.lstrip("/")
        return str(path)

    def map_value(self, value: Any) -> Any:
        return self.local(value) if isinstance(value, str) and value.startswith("/") else value


def node_agent(
    manifest: Manifest,
    root: Path,
    node: str,
    broker: str,
    config: dict[str, Any] | None = None,
    extra_env: dict[str, str] | None = None,
) -> DeployedAgent:
    """The agent of ``manifest`` on a test node named ``node``, forwarding to ``broker`` (HOST:PORT).

    ``config`` overrides ConfigMap keys (timings); the vendor becomes ``fake``, the listen address a free
    port. Every hostPath directory the pod mounts is created, as the kubelet does (DirectoryOrCreate).
    """
    paths = NodePaths(manifest, root)
    for volume in manifest.mounts.values():
        if "hostPath" in volume and not volume["hostPath"]["path"].startswith("/proc"):
            paths.host(volume["hostPath"]["path"]).mkdir(parents=True, exist_ok=True)
    values = {key: paths.map_value(value) for key, value in manifest.config.items()}
    url = urlsplit(values["mqtt.url"])
    values["mqtt.url"] = f"{url.scheme}://{broker}"
    values["gpu-vendor"] = "fake"
    values.update(config or {})
    args = []
    for arg in manifest.args:
        flag, sep, value = arg.partition("=")
        args.append(flag + sep + paths.map_value(value) if sep else arg)
    config_flag = next(a for a in args if a.startswith("--config.file="))
    config_file = Path(config_flag.partition("=")[2])
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(values, sort_keys=False), encoding="utf-8")
    env = {}
    for item in manifest.env:
        ref = item.get("valueFrom", {})
        if ref.get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[item["name"]] = node
        elif "value" in item:
            env[item["name"]] = str(paths.map_value(item["value"]))
        # secretKeyRef: the optional Secret does not exist on this node (certificates instead)
    env.update(extra_env or {})
    return DeployedAgent(root, paths, args, env)


class DeployedAgent(Proc):
    """The exporter CLI with the deployment's args and environment, its log in a file."""

    def __init__(self, root: Path, paths: NodePaths, args: list[str], env: dict[str, str]) -> None:
        super().__init__(root, *args, name="agent")
        self.paths = paths
        self.env = env

    def start(self) -> DeployedAgent:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(exporter_cmd(*self.args), env=child_env(**self.env), stdout=log, stderr=log)
        assert wait_until(self._ready, 20), f"agent not ready: {self.log()}"
        return self

    def gauge(self, name: str) -> float:
        """A series of the agent's page (any of its own metrics), 0 when absent."""
        for line in self.scrape().splitlines():
            if line.startswith(name + " "):
                return float(line.rpartition(" ")[2])
        return 0.0


def provision_node_credentials(paths: NodePaths, manifest: Manifest, tls: dict[str, str], node: str) -> None:
    """Put a client certificate for ``node`` (CN = node name) where the ConfigMap says the pod reads it."""
    pki = Path(tls["ca"]).parent
    key, cert = pki / f"{node}.key", pki / f"{node}.crt"
    csr, ext = pki / f"{node}.csr", pki / f"{node}.ext"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={node}")
    ext.write_text("extendedKeyUsage=clientAuth\n")
    openssl(
        *("x509", "-req", "-in", str(csr), "-CA", tls["ca"], "-CAkey", str(pki / "ca.key"), "-CAcreateserial"),
        *("-out", str(cert), "-days", "2", "-extfile", str(ext)),
    )
    for option, source in (
        ("mqtt.tls.ca-file", Path(tls["ca"])),
        ("mqtt.tls.cert-file", cert),
        ("mqtt.tls.key-file", key),
    ):
        target = Path(paths.local(manifest.config[option]))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())


class CloudBroker(MosquittoServer):
    """deploy/cloud-broker/mosquitto.conf on free ports: ``port`` for edge nodes (TLS), ``internal_port``."""

    name = "cloud-broker"
    BRIDGE_USER = "gpu-exporter-bridge"

    def __init__(self, workdir: Path, tls: dict[str, str]) -> None:
        super().__init__(workdir)
        self.internal_port = free_port()
        self.bridge_password = "bridge-secret"
        self.password_file = workdir / "bridge-password"
        self.password_file.write_text(self.bridge_password + "\n")
        passwd = workdir / "passwd"
        subprocess.run([MOSQUITTO_PASSWD, "-c", "-b", str(passwd), self.BRIDGE_USER, self.bridge_password], check=True)
        files = {
            "/mosquitto/certs/ca.crt": tls["ca"],
            "/mosquitto/certs/server.crt": tls["cert"],
            "/mosquitto/certs/server.key": tls["key"],
            "/mosquitto/config/acl-cluster": str(CLOUD_BROKER / "acl-cluster"),
            "/mosquitto/config/acl": str(CLOUD_BROKER / "acl"),
            "/mosquitto/config/passwd": str(passwd),
            "/mosquitto/data/": f"{workdir}/",
        }
        text = (CLOUD_BROKER / "mosquitto.conf").read_text(encoding="utf-8")
        for shipped, here in files.items():
            assert shipped in text, shipped
            text = text.replace(shipped, here)
        text = re.sub(r"^listener 8883$", f"listener {self.port} 127.0.0.1", text, flags=re.M)
        text = re.sub(r"^listener 1883$", f"listener {self.internal_port} 127.0.0.1", text, flags=re.M)
        text += "autosave_interval 1\nlog_dest stdout\nconnection_messages true\n"
        if os.geteuid() == 0:
            text += "user root\n"  # else mosquitto drops to its own user and cannot read tmp_path
        self.config_path.write_text(text)

    def ready(self) -> bool:
        import socket

        for port in (self.port, self.internal_port):
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                pass
        return True

    @property
    def url(self) -> str:
        """The in-cluster listener, for the bridge and test subscribers."""
        return f"mqtt://127.0.0.1:{self.internal_port}"

    @property
    def credentials(self) -> list[str]:
        """The bridge's options for the in-cluster listener's user (the bridge, `gpu-exporter tail`)."""
        return [f"--mqtt.username={self.BRIDGE_USER}", f"--mqtt.password-file={self.password_file}"]


@dataclass
class Cloud:
    broker: CloudBroker
    tsdb: Server
    bridge: BridgeProcess
    seen: Collector
    wan: TcpProxy
    tls: dict[str, str]


@pytest.fixture(name="cloud")
def cloud_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cloud]:
    """The cloud side behind a WAN proxy; ``request.param`` names the TSDB (victoria-metrics, prometheus)."""
    tls = make_tls(tmp_path / "pki", client=False)
    broker = CloudBroker(tmp_path / "cloud-broker", tls)
    tsdb: Server = (
        VictoriaMetricsServer(tmp_path / "vm")
        if request.param == "victoria-metrics"
        else PrometheusServer(tmp_path / "prom", ooo_window="1h")
    )
    broker.start()
    tsdb.start()
    bridge = BridgeProcess(tmp_path, broker, tsdb.write_url, "cloud-bridge", *broker.credentials)  # type: ignore[arg-type]
    try:
        internal = cast(Broker, SimpleNamespace(port=broker.internal_port))
        with (
            Collector(internal, username=broker.BRIDGE_USER, password=broker.bridge_password) as seen,
            TcpProxy(("127.0.0.1", broker.port)) as wan,
        ):
            bridge.start()
            yield Cloud(broker, tsdb, bridge, seen, wan, tls)
    finally:
        bridge.stop()
        tsdb.stop()
        broker.stop()
