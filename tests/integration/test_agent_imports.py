"""The agent loads only what the features it runs use: without forwarding, pod attribution and web auth,
no MQTT client, spool, bcrypt, gRPC or protobuf (each costs a small board resident memory for nothing);
TLS on the endpoint without users loads no bcrypt either.

The agent is the shipped entry point, ``python -m gpu_exporter`` run by ``runpy`` in a child process, with a
watcher thread beside it that waits for the first page with GPUs on it (over a bare socket, so that it
loads nothing an HTTP client would), writes the process's ``sys.modules`` to a file and stops the agent
with SIGTERM, as a user would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import child_env, free_port
from tests.support.tls import make_tls
from tests.support.tsdb import MosquittoServer

pytestmark = pytest.mark.integration

WRAPPER = r"""
import json, os, runpy, signal, socket, sys, threading, time

out, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = ["gpu-exporter", f"--web.listen-address=127.0.0.1:{port}", *sys.argv[4:]]


def connect():
    conn = socket.create_connection(("127.0.0.1", port), timeout=2)
    if ca:  # https, the server's certificate checked (an agent serving TLS has loaded ssl itself)
        import ssl

        conn = ssl.create_default_context(cafile=ca).wrap_socket(conn, server_hostname="127.0.0.1")
    return conn


def served():
    try:
        with connect() as conn:
            conn.sendall(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
    except OSError:
        return False
    return b" 200 " in data.split(b"\r\n", 1)[0] and b"\ngpu_up{" in data


def watch():
    deadline = time.monotonic() + 30
    ok = served()
    while not ok and time.monotonic() < deadline:
        time.sleep(0.1)
        ok = served()
    with open(out + ".tmp", "w") as f:
        json.dump({"served": ok, "modules": sorted(sys.modules)}, f)
    os.replace(out + ".tmp", out)
    os.kill(os.getpid(), signal.SIGTERM)


threading.Thread(target=watch, daemon=True).start()
runpy.run_module("gpu_exporter", run_name="__main__", alter_sys=True)
"""

AGENT = ["--gpu-vendor=fake", "--fake.gpus=8", "--gpu-metrics-collection-interval=200ms", "--node-name=edge-1"]
# What only forwarding, pod attribution, web auth, the config file or the bridge use; none of it may be
# loaded by an agent that runs none of them. The options tables (gpu_exporter.forward.options and the
# like) are not listed: every command reads them before it knows what it runs.
UNUSED = (
    "paho",
    "diskcache",
    "sqlite3",
    "bcrypt",
    "grpc",
    "google.protobuf",
    "cramjam",
    "yaml",
    "prometheus_client.parser",
    "prometheus_client.openmetrics.parser",
    "prometheus_client.twisted",
    "prometheus_client.bridge",
    "prometheus_client.multiprocess",
    "gpu_exporter.forward.service",
    "gpu_exporter.forward.spool",
    "gpu_exporter.mqtt.client",
    "gpu_exporter.payload",
    "gpu_exporter.k8s.attribution",
    "gpu_exporter.k8s.podresources",
    "gpu_exporter.bridge.service",
)


def loaded_modules(tmp_path: Path, *args: str, ca: str = "") -> list[str]:
    """The modules the agent had loaded once its first page with GPUs was served (over https when ``ca``,
    the CA file its certificate is checked against, is given)."""
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(out), str(free_port()), ca, *AGENT, *args],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["served"], f"no page with GPUs served: {done.stderr[-2000:]}"
    return list(report["modules"])


def among(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` loaded: the module itself or any of its submodules."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def test_an_agent_without_forwarding_pods_or_auth_loads_none_of_their_libraries(tmp_path: Path) -> None:
    modules = loaded_modules(tmp_path)
    assert "gpu_exporter.exposition" in modules and "prometheus_client" in modules  # it did serve its page
    assert among(modules, UNUSED) == []


def test_tls_without_users_loads_no_bcrypt(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "pki", client=False)
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {tls['cert']}\n  key_file: {tls['key']}\n")
    modules = loaded_modules(tmp_path, f"--web.config.file={web}", ca=tls["ca"])
    assert "gpu_exporter.web.tls" in modules and "yaml" in modules  # the file was read, TLS served
    assert among(modules, tuple(n for n in UNUSED if n != "yaml")) == []


def test_forwarding_loads_the_mqtt_client_and_the_spool_and_still_no_other_feature(tmp_path: Path) -> None:
    broker = MosquittoServer(tmp_path / "mqtt")
    broker.start()
    try:
        modules = loaded_modules(tmp_path, f"--mqtt.url={broker.url}", f"--spool.dir={tmp_path / 'spool'}")
    finally:
        broker.stop()
    assert among(modules, ("paho.mqtt.client", "diskcache", "gpu_exporter.forward.service")) == [
        "paho.mqtt.client",
        "diskcache",
        "gpu_exporter.forward.service",
    ]
    forwarding = ("paho", "diskcache", "sqlite3", "gpu_exporter.forward.service", "gpu_exporter.forward.spool")
    forwarding += ("gpu_exporter.mqtt.client", "gpu_exporter.payload")
    assert among(modules, tuple(n for n in UNUSED if n not in forwarding)) == []
