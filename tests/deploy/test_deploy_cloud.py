"""The KubeEdge deployment's path to the cloud: the agent forwards straight to the cloud broker over TLS,
with a client certificate that lives on its own node, and the shipped cloud broker configuration keeps
each node to its own topics. (tests/integration/test_topology.py runs the whole path with an outage.)"""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import paho.mqtt.client as paho
import yaml
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from gpu_exporter import config
from tests.support import child_env, exporter_cmd, paths
from tests.support.deployed import DAEMONSET, CloudBroker, Manifest, NodePaths, node_agent, provision_node_credentials
from tests.support.mosquitto import make_tls, wait_until

NODE = "edge-7"
TLS_OPTIONS = ("mqtt.tls.ca-file", "mqtt.tls.cert-file", "mqtt.tls.key-file")


def test_the_cloud_broker_is_named_once_and_reached_over_tls() -> None:
    manifest = Manifest.load()
    url = urlsplit(manifest.config["mqtt.url"])
    assert url.scheme == "mqtts"
    assert url.port in (None, 8883)  # the port to open outbound in the edge firewall
    assert url.hostname not in ("127.0.0.1", "localhost", "::1")  # not a broker on the node itself
    assert DAEMONSET.read_text(encoding="utf-8").count(str(url.hostname)) == 1
    sources = paths.ROOT / "deploy" / "kubeedge"
    assert sum(f.read_text(encoding="utf-8").count(str(url.hostname)) for f in sources.iterdir()) == 1


def test_each_node_reads_its_own_credentials_from_a_read_only_host_directory() -> None:
    manifest = Manifest.load()
    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text(encoding="utf-8")) if d]
    (daemonset,) = [d for d in docs if d["kind"] == "DaemonSet"]
    mounts = {m["mountPath"]: m for m in daemonset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    for option in TLS_OPTIONS:
        path = manifest.config[option]
        host = manifest.host_path(path)
        assert host is not None and host.startswith("/etc/gpu-exporter/mqtt/"), (option, host)
        mount = next(m for p, m in mounts.items() if path.startswith(p.rstrip("/") + "/"))
        assert mount["readOnly"] is True
    # one pod spec serves every node: nothing node-specific may come from a Secret shared by all
    assert not any(
        "secret" in manifest.mounts[p] for p in manifest.mounts if manifest.config["mqtt.tls.key-file"].startswith(p)
    )


def test_the_agent_accepts_the_configuration_on_a_provisioned_node(tmp_path: Path) -> None:
    manifest = Manifest.load()
    tls = make_tls(tmp_path / "pki", client=False)
    paths = NodePaths(manifest, tmp_path / NODE)
    provision_node_credentials(paths, manifest, tls, NODE)
    values = {k: paths.map_value(v) for k, v in manifest.config.items()}
    values["mqtt.url"] = "mqtts://127.0.0.1:8883"
    file = tmp_path / "config.yaml"
    file.write_text(yaml.safe_dump(values), encoding="utf-8")
    loaded = config.load({"config.file": str(file)}, environ={"NODE_NAME": NODE})
    assert loaded.mqtt_tls_cert_file.endswith("/etc/gpu-exporter/mqtt/tls.crt")
    assert loaded.node_name == NODE
    assert loaded.mqtt_protocol == "5"


def test_a_node_without_credentials_gets_one_line_naming_the_missing_file(tmp_path: Path) -> None:
    agent = node_agent(Manifest.load(), tmp_path / NODE, NODE, "127.0.0.1:8883")
    result = subprocess.run(
        exporter_cmd(*agent.args), env=child_env(**agent.env), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "/etc/gpu-exporter/mqtt/" in lines[0] and "cannot read" in lines[0], lines


def _client(tls: dict[str, str], cert: str | None, key: str | None, port: int) -> tuple[paho.Client, list[int]]:
    client = paho.Client(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id="acl-check", protocol=MQTTProtocolVersion.MQTTv5
    )
    client.tls_set(ca_certs=tls["ca"], certfile=cert, keyfile=key)
    acks: list[int] = []
    client.on_publish = lambda c, u, mid, reason, props: acks.append(reason.value)
    client.connect("127.0.0.1", port, keepalive=10)
    return client, acks


def _connects_without_a_certificate(tls: dict[str, str], port: int) -> bool:
    accepted: list[int] = []
    try:
        client, _ = _client(tls, None, None, port)
        client.on_connect = lambda c, u, flags, reason, props: accepted.append(reason.value)
        for _ in range(20):
            client.loop(timeout=0.1)
    except (ssl.SSLError, OSError):  # the broker ends the handshake: no client certificate
        return False
    return accepted == [0]


def test_the_cloud_broker_keeps_each_node_to_its_own_topics(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "pki", client=False)
    manifest = Manifest.load()
    paths = NodePaths(manifest, tmp_path / NODE)
    provision_node_credentials(paths, manifest, tls, NODE)
    node_dir = paths.host("/etc/gpu-exporter/mqtt")
    broker = CloudBroker(tmp_path / "cloud", tls)
    broker.start()
    try:
        client, acks = _client(tls, str(node_dir / "tls.crt"), str(node_dir / "tls.key"), broker.port)
        client.loop_start()
        try:
            client.publish(f"gpu-exporter/{NODE}/batch", b"{}", qos=1)
            client.publish("gpu-exporter/edge-8/batch", b"{}", qos=1)  # another node's topic
            assert wait_until(lambda: len(acks) == 2, 10)
            assert acks[0] < 0x80  # accepted (0x10: no subscriber yet)
            assert acks[1] == 0x87  # not authorized
        finally:
            client.loop_stop()
            client.disconnect()
        assert not _connects_without_a_certificate(tls, broker.port)
    finally:
        broker.stop()
