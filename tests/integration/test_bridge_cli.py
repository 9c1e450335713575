"""``gpu-exporter bridge`` as a user runs it: errors in one line, a working process, its /metrics."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter.payload import encode
from tests.support import paths
from tests.support.bridge_helpers import Publisher, expected_points, make_batch, stored_points
from tests.support.tsdb import MosquittoServer, PrometheusServer, free_port, http_get, wait_until

pytestmark = pytest.mark.integration

SRC = str(paths.ROOT / "src")


def bridge_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpu_exporter", "bridge", *args]


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = SRC
    return env


def run_bridge(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bridge_cmd(*args), capture_output=True, text=True, timeout=timeout, env=child_env())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--remote-write.url=http://127.0.0.1:9/api/v1/write"], "--mqtt.url is required"),
        (["--mqtt.url=mqtt://127.0.0.1:1883"], "--remote-write.url is required"),
        (["--mqtt.url=mqtt://127.0.0.1:1883", "--remote-write.url=ftp://x/"], "invalid URL"),
        (["--mqtt.url=mqtt://h", "--remote-write.url=http://h/w", "--bridge.node-label=__x"], "invalid label name"),
        (["--mqtt.url=mqtt://h", "--remote-write.url=http://h/w", "--bridge.group=a/b"], "shared-subscription"),
        (
            ["--mqtt.url=mqtt://h", "--remote-write.url=http://h/w", "--remote-write.headers=Content-Type=x"],
            "set by the bridge itself",
        ),
        (
            ["--mqtt.url=mqtt://h", "--remote-write.url=http://h/w", "--remote-write.password-file=/nonexistent"],
            "cannot read the remote-write password file",
        ),
        (["--mqtt.url=tcp://h:1883", "--remote-write.url=http://h/w"], "invalid MQTT URL 'tcp://h:1883'"),
        (
            ["--mqtt.url=mqtt://h", "--remote-write.url=http://h/w", "--mqtt.password-file=/nonexistent"],
            "--mqtt.password-file=/nonexistent: cannot read: No such file or directory",
        ),
        (
            ["--mqtt.url=mqtts://h", "--remote-write.url=http://h/w", "--mqtt.tls.ca-file=/nonexistent"],
            "--mqtt.tls.ca-file=/nonexistent: cannot read: No such file or directory",
        ),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run_bridge(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_help_lists_the_bridge_options() -> None:
    result = run_bridge("--help")
    assert result.returncode == 0
    for flag in ("--remote-write.url", "--bridge.group", "--mqtt.url", "--remote-write.bearer-token-file"):
        assert flag in result.stdout
    assert "--fake.gpus" not in result.stdout  # exporter-only options stay out


def test_metrics_port_in_use_exits_1(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_bridge(
            "--mqtt.url=mqtt://127.0.0.1:1",
            "--remote-write.url=http://127.0.0.1:9/api/v1/write",
            f"--bridge.listen-address=127.0.0.1:{port}",
        )
    assert result.returncode == 1
    assert "address already in use" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[MosquittoServer, PrometheusServer]]:
    broker = MosquittoServer(tmp_path / "mqtt")
    prom = PrometheusServer(tmp_path / "prom", ooo_window="1h")
    broker.start()
    prom.start()
    yield broker, prom
    prom.stop()
    broker.stop()


def test_the_bridge_process_writes_batches_and_serves_its_metrics(
    servers: tuple[MosquittoServer, PrometheusServer], tmp_path: Path
) -> None:
    broker, prom = servers
    port = free_port()
    token = tmp_path / "token"
    token.write_text("unused-by-prometheus\n")
    log = open(tmp_path / "bridge.log", "w")  # noqa: SIM115 - closed below
    env = child_env()
    env["GPU_EXPORTER_MQTT_TOPIC_PREFIX"] = "fleet"  # environment variables work too
    proc = subprocess.Popen(
        bridge_cmd(
            f"--mqtt.url={broker.url}",
            f"--remote-write.url={prom.write_url}",
            f"--remote-write.bearer-token-file={token}",
            f"--bridge.listen-address=127.0.0.1:{port}",
            f"--bridge.client-id=cli-{uuid.uuid4().hex[:6]}",
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    pub = Publisher(broker.port)
    try:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: b"gpu_exporter_bridge_mqtt_connected 1.0" in http_get(metrics_url), 20, "bridge up")
        pub.publish("fleet/edge-cli/status", b"online", retain=True)
        batch = make_batch("edge-cli", "boot", [1, 2, 3, 4], time.time() - 120)
        pub.publish("fleet/edge-cli/batch", encode(batch))
        want = expected_points(batch)
        wait_until(lambda: want <= stored_points(prom.samples('{node="edge-cli"}')), 20, "samples in Prometheus")
        page = http_get(metrics_url).decode()
        assert "gpu_exporter_bridge_gpu_samples_written_total 8.0" in page
        assert 'gpu_exporter_node_up{node="edge-cli"} 1.0' in page
        assert "gpu_exporter_bridge_lag_seconds" in page
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        pub.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert "Traceback" not in (tmp_path / "bridge.log").read_text()


def test_the_bridge_connects_with_tls_and_a_password_file(tmp_path: Path) -> None:
    from tests.support.mosquitto import Broker, make_tls

    tls = make_tls(tmp_path / "tls", client=False)
    broker = Broker(tmp_path / "mqtt", users={"bridge": "s3cret", "edge": "edge-pw"}, tls=tls)
    prom = PrometheusServer(tmp_path / "prom", ooo_window="1h")
    broker.start()
    prom.start()
    password = tmp_path / "mqtt-password"
    password.write_text("s3cret\n")
    port = free_port()
    proc = subprocess.Popen(
        bridge_cmd(
            f"--mqtt.url={broker.url}",
            "--mqtt.username=bridge",
            f"--mqtt.password-file={password}",
            f"--mqtt.tls.ca-file={tls['ca']}",
            f"--remote-write.url={prom.write_url}",
            f"--bridge.listen-address=127.0.0.1:{port}",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=child_env(),
    )
    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    pub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="edge-tls", protocol=mqtt.MQTTv5)
    pub.username_pw_set("edge", "edge-pw")
    pub.tls_set(ca_certs=tls["ca"])
    try:
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        wait_until(lambda: b"gpu_exporter_bridge_mqtt_connected 1.0" in http_get(metrics_url), 20, "bridge over TLS")
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        batch = make_batch("edge-tls", "boot", [1, 2], time.time() - 60)
        pub.publish("gpu-exporter/edge-tls/batch", encode(batch), qos=1).wait_for_publish(10)
        want = expected_points(batch)
        wait_until(lambda: want <= stored_points(prom.samples('{node="edge-tls"}')), 20, "samples over TLS")
    finally:
        pub.loop_stop()
        proc.kill()
        proc.wait()
        prom.stop()
        broker.stop()


def test_an_unreachable_broker_is_reported_and_sigterm_still_stops_cleanly(tmp_path: Path) -> None:
    log_path = tmp_path / "bridge.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            bridge_cmd(
                f"--mqtt.url=mqtt://127.0.0.1:{free_port()}",
                "--remote-write.url=http://127.0.0.1:9/api/v1/write",
                f"--bridge.listen-address=127.0.0.1:{free_port()}",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(),
        )
    try:
        wait_until(lambda: "cannot connect to MQTT broker" in log_path.read_text(), 20, "the warning")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log_path.read_text()
