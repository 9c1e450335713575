"""A forwarder that cannot silently die: hostile inputs, unlucky timing and flapping links.

Each test ends with "nothing lost" (sequence numbers end to end) or "the loss is counted".
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import diskcache
import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter import config as cfg
from gpu_exporter.forward import service
from gpu_exporter.forward import spool_faults as spool_module
from gpu_exporter.forward.service import Forwarder
from gpu_exporter.forward.spool import Spool
from gpu_exporter.ring import RingBuffer
from tests.integration.test_forward_service import Feeder, make_config, make_sample, metric
from tests.support import child_env, exporter_cmd, http_get
from tests.support.agent_proc import FAST, Proc
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)
from tests.support.mqtt_proxy import Proxy

pytestmark = pytest.mark.integration


def run(config: cfg.Config, ring: RingBuffer) -> tuple[Forwarder, CollectorRegistry]:
    registry = CollectorRegistry()
    fwd = Forwarder(config, ring, registry)
    fwd.start()
    assert fwd.ready.wait(10)
    return fwd, registry


def spooled(directory: str) -> set[int]:
    """Sequence numbers a stopped forwarder left in its spool (batches and journal)."""
    spool = Spool(directory, 1 << 30, 1e9)
    journal = spool.open()
    seqs = {s for e in spool.entries() for s in range(e.first_seq, e.last_seq + 1)}
    spool.close()
    return seqs | {int(k.rsplit(".", 1)[1]) for k, _ in journal}


# ----------------------------------------------------------------------------------- flapping link


def test_a_link_that_dies_after_each_connack_backs_off_logs_once_and_loses_nothing(
    tmp_path: Path, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "gpu_exporter.forward")
    ring = RingBuffer(4096)
    with Collector(broker) as sub, Proxy(broker.port, cut_after=0.3) as proxy:
        config = make_config(tmp_path, broker, **{"mqtt.url": proxy.url, "mqtt.reconnect-max-delay": "8s"})
        fwd, _ = run(config, ring)
        try:
            with Feeder(ring, interval=0.05) as feeder:
                assert wait_until(lambda: len(proxy.wire.connacks) >= 5, 40)
                proxy.cut_after = None  # the link holds again
            with proxy.wire.lock:
                times = list(proxy.wire.connacks[:5])
            last = feeder.seq
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, last + 1)), 60)
        finally:
            fwd.stop(5)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Each gap is the 0.3 s the link held plus the backoff: 0.25-0.5 s, then 0.5-1, 1-2, 2-4 s. Without
    # damping every CONNACK reset the backoff and each gap was 0.3 s plus 0-0.5 s.
    assert gaps[3] > gaps[0] + 1.0, gaps
    lost = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and " lost: " in r.getMessage()]
    assert lost and len(lost) == len(set(lost)) < len(times), lost  # each reason once a minute, not per attempt
    connected = [r for r in caplog.records if r.levelno >= logging.INFO and "connected to MQTT" in r.getMessage()]
    assert len(connected) <= 2, [r.getMessage() for r in connected]


# ----------------------------------------------------------------------------------- hostile inputs


def test_a_password_file_rotated_to_bytes_that_are_not_utf8_does_not_stop_forwarding(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "mosquitto", users={"edge": "right"})
    broker.start()
    secret = tmp_path / "password"
    secret.write_text("right\n")
    try:
        ring = RingBuffer(256)
        config = make_config(tmp_path, broker, **{"mqtt.username": "edge", "mqtt.password-file": str(secret)})
        secret.write_bytes(b"\xff\xfe\x80 not utf-8\n")  # rotated after the start-up check
        with Collector(broker, username="edge", password="right") as sub:
            fwd, registry = run(config, ring)
            try:
                for seq in range(1, 6):
                    ring.append(make_sample(seq))
                assert wait_until(
                    lambda: metric(registry, "gpu_exporter_forward_connect_errors_total", kind="auth") >= 1, 15
                )
                secret.write_text("right\n")  # rotated again, to the right one
                for seq in range(6, 11):
                    ring.append(make_sample(seq))
                assert wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, 11)), 30)
                assert fwd.health()[0]
            finally:
                fwd.stop(5)
        assert metric(registry, "gpu_exporter_forward_internal_errors_total") == 0
    finally:
        broker.stop()


def test_an_unexpected_error_in_the_forwarder_is_contained_counted_and_shown_in_readiness(
    tmp_path: Path, broker: Broker, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {"on": True}
    real_encode = service.encode

    def encode(*args: Any, **kwargs: Any) -> bytes:
        if broken["on"]:
            raise RuntimeError("injected fault")
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(service, "encode", encode)
    ring = RingBuffer(256)
    with Collector(broker) as sub:
        fwd, registry = run(make_config(tmp_path, broker), ring)
        try:
            for seq in range(1, 6):
                ring.append(make_sample(seq))
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_internal_errors_total") >= 2, 15)
            ok, why = fwd.health()
            assert not ok and "injected fault" in why
            assert metric(registry, "gpu_exporter_forward_working") == 0
            broken["on"] = False
            for seq in range(6, 11):
                ring.append(make_sample(seq))
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, 11)), 30)
            assert wait_until(lambda: fwd.health()[0], 10)
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_working") == 1, 10)
        finally:
            fwd.stop(5)
    errors = [r for r in caplog.records if "injected fault" in r.getMessage()]
    assert len(errors) == 1  # logged once, not once per retry


@pytest.mark.parametrize("name", ["edge/1", "gpu+node", "node#", "n" * 254, "tab\tnode"])
def test_a_node_name_that_cannot_be_a_topic_level_is_a_usage_error(tmp_path: Path, name: str) -> None:
    with pytest.raises(cfg.ConfigError, match="node-name"):
        cfg.load({"mqtt.url": "mqtt://127.0.0.1:1883", "node-name": name}, environ={})
    cfg.load({"node-name": "edge/1"}, environ={})  # without forwarding the name is only a label


def test_the_exporter_refuses_a_node_name_with_nul_at_start_with_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "config.yaml"
    conf.write_text('node-name: "edge\\0one"\nmqtt.url: mqtt://127.0.0.1:1883\n')
    try:
        done = subprocess.run(
            exporter_cmd("--gpu-vendor=fake", f"--config.file={conf}", "--web.listen-address=127.0.0.1:0"),
            env=child_env(),
            capture_output=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the exporter started with a node name that cannot be an MQTT topic level")
    assert done.returncode == 2
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "node-name" in lines[0] and "MQTT topic" in lines[0], lines


def test_the_agent_announces_its_own_maximum_packet_size_in_connect(tmp_path: Path, broker: Broker) -> None:
    ring = RingBuffer(16)
    with Proxy(broker.port) as proxy:
        fwd, registry = run(make_config(tmp_path, broker, **{"mqtt.url": proxy.url}), ring)
        try:
            assert wait_until(lambda: metric(registry, "gpu_exporter_forward_connected") == 1, 10)
        finally:
            fwd.stop(5)
        with proxy.wire.lock:
            body = proxy.wire.connects[0]
    assert body[:7] == b"\x00\x04MQTT\x05"
    props_len, pos = body[10], 11  # flags (1) and keepalive (2) after the level; a one-byte length here
    props = body[pos : pos + props_len]
    i, found = 0, None
    while i < len(props):  # (id, value) pairs; only the fixed-size kinds the agent sends
        pid = props[i]
        size = {0x11: 4, 0x21: 2, 0x22: 2, 0x27: 4, 0x17: 1, 0x19: 1}[pid]
        if pid == 0x27:
            found = int.from_bytes(props[i + 1 : i + 1 + size], "big")
        i += 1 + size
    assert found == 64 * 1024


# ----------------------------------------------------------------------------------- refusals


def test_a_broker_that_refuses_publishes_gets_backoff_and_one_line_then_everything(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl = tmp_path / "acl"
    acl.write_text("topic read gpu-exporter/#\ntopic write gpu-exporter/+/status\n")  # batches: not authorized
    broker = Broker(tmp_path / "mosquitto", extra=f"acl_file {acl}\n")
    broker.start()
    try:
        ring = RingBuffer(256)
        with Collector(broker) as sub, Proxy(broker.port) as proxy:
            config = make_config(tmp_path, broker, **{"mqtt.url": proxy.url, "mqtt.reconnect-max-delay": "4s"})
            fwd, registry = run(config, ring)
            try:
                for seq in range(1, 11):
                    ring.append(make_sample(seq))
                    time.sleep(0.03)
                assert wait_until(lambda: metric(registry, "gpu_exporter_forward_refused_publishes_total") >= 1, 15)
                time.sleep(3)  # what a refusing broker sees for a while
                with proxy.wire.lock:
                    attempts = len(proxy.wire.publish_sizes)
                acl.write_text("topic readwrite gpu-exporter/#\n")
                assert broker.proc is not None
                broker.proc.send_signal(signal.SIGHUP)  # Mosquitto reloads its ACL
                assert wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, 11)), 30)
            finally:
                fwd.stop(5)
    finally:
        broker.stop()
    # One step of backoff per refused window (1 s, 2 s, 4 s): three windows of at most a few batches in
    # 3 s, where the replay rate (200 batches/s here) republished each refused batch at once before.
    assert attempts < 60, attempts
    lines = [r for r in caplog.records if "broker refused" in r.getMessage()]  # a batch or a health report
    assert len(lines) == 1, [r.getMessage() for r in lines]


# ----------------------------------------------------------------------------------- spool


def test_a_spool_directory_that_becomes_usable_after_start_is_opened_and_keeps_everything(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-yet"
    blocker.write_text("")  # the spool's parent is a file: nothing can be created under it
    ring = RingBuffer(256)
    config = make_config(
        tmp_path,
        Broker(tmp_path / "unused"),  # never started: the broker is down all along
        **{"spool.dir": str(blocker / "spool")},
    )
    fwd, registry = run(config, ring)
    try:
        for seq in range(1, 11):
            ring.append(make_sample(seq))
            time.sleep(0.05)
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_spool_batches") >= 1, 10)
        blocker.unlink()  # the volume is there now
        assert wait_until(lambda: (blocker / "spool" / "cache.db").exists(), 15)
        for seq in range(11, 21):
            ring.append(make_sample(seq))
            time.sleep(0.05)
    finally:
        fwd.stop(5)
    assert spooled(str(blocker / "spool")) == set(range(1, 21))  # the next start sends all of them
    assert metric(registry, "gpu_exporter_forward_dropped_samples_total", reason="disk_full") == 0


def test_a_clean_stop_forwards_or_journals_the_very_last_sample(tmp_path: Path, broker: Broker) -> None:
    ring = RingBuffer(256)
    with Collector(broker) as sub:
        fwd, registry = run(make_config(tmp_path, broker, **{"mqtt.batch-interval": "1h"}), ring)
        assert wait_until(lambda: metric(registry, "gpu_exporter_forward_connected") == 1, 10)
        for seq in range(1, 5):
            ring.append(make_sample(seq))
        time.sleep(0.3)  # the forwarder takes these, and waits for more
        ring.append(make_sample(5))
        fwd.stop(5)  # at once: the last sample was taken by the sampler, not yet by the forwarder
        wait_until(lambda: sub.seqs().get(fwd.boot) == set(range(1, 6)), 5)
        arrived = sub.seqs().get(fwd.boot, set())
    assert arrived | spooled(fwd.config.spool_dir) == set(range(1, 6))


def test_a_spool_database_found_corrupt_while_running_is_moved_aside_and_counted_as_corrupt(
    tmp_path: Path,
) -> None:
    drops: list[tuple[str, int, int]] = []
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9, lambda r, b, s: drops.append((r, b, s)))
    spool.open()
    for i in range(20):
        spool.put(os.urandom(300), i * 3 + 1, i * 3 + 3, 3)
    # The database file is damaged under the running agent (a bad sector, a torn write); SQLite finds it on
    # the next connection that reads those pages.
    assert spool._cache is not None
    spool._cache.close()
    db = tmp_path / "spool" / "cache.db"
    with open(db, "r+b") as handle:  # the last pages: the rows of the queue
        handle.seek(db.stat().st_size - 3 * 4096)
        handle.write(b"\xa5" * 3 * 4096)
    spool._cache = diskcache.Cache(str(tmp_path / "spool"), disk=spool_module._Disk, **spool_module.SETTINGS)
    try:
        spool.put(b"fresh batch", 61, 63, 3)
    except sqlite3.DatabaseError as exc:  # pragma: no cover - the point of the test
        pytest.fail(f"raised {exc}")
    assert spool.write_errors == 0  # not a full disk
    assert ("corrupt", 20, 60) in drops
    assert any(p.name.startswith("db-") for p in (tmp_path / "spool" / "corrupt").iterdir())
    assert [(e.first_seq, e.last_seq) for e in spool.entries()] == [(61, 63)]
    spool.close()
    again = Spool(str(tmp_path / "spool"), 1 << 30, 1e9)
    again.open()
    assert [(e.first_seq, e.last_seq) for e in again.entries()] == [(61, 63)]  # on disk, in the new one
    again.close()


def test_readyz_says_when_forwarding_does_not_work(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "mosquitto", extra="max_qos 0\n")  # forwarding there is refused
    broker.start()
    proc = Proc(tmp_path, *FAST, f"--mqtt.url={broker.url}", f"--spool.dir={tmp_path / 'spool'}")
    try:
        with open(proc.log_path, "wb") as log:
            proc.proc = subprocess.Popen(exporter_cmd(*proc.args), env=child_env(), stdout=log, stderr=log)

        def readyz() -> tuple[int, bytes]:
            try:
                status, body, _ = http_get(f"http://127.0.0.1:{proc.port}/readyz", timeout=1)
            except OSError:
                return 0, b""
            return status, body

        assert wait_until(lambda: readyz()[0] == 503 and b"Maximum QoS 0" in readyz()[1], 20), proc.log()
        assert wait_until(lambda: proc.metric("gpu_exporter_forward_working") == 0, 5)
    finally:
        proc.stop()
        broker.stop()


def test_tail_with_a_password_that_is_not_utf8_says_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_exporter.forward.tail import main as tail

    broker = Broker(tmp_path / "mosquitto", users={"edge": "right"})
    broker.start()
    secret = tmp_path / "password"
    secret.write_bytes(b"\xff\xfe\x80\n")
    try:
        argv = [f"--mqtt.url={broker.url}", "--mqtt.username=edge", f"--mqtt.password-file={secret}", "--timeout=5s"]
        assert tail(argv, out=io.StringIO()) == 1
    finally:
        broker.stop()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused" in err[0], err


def test_a_peer_that_sends_a_packet_over_the_announced_maximum_is_cut_off_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """A rogue "broker" on a plain mqtt:// path: CONNACK, then a PUBLISH whose header says 200 MB."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(10)
    port = server.getsockname()[1]
    sent = {"bytes": 0}

    def rogue() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.recv(4096)  # the CONNECT
            conn.sendall(b"\x20\x03\x00\x00\x00")  # CONNACK, success, no properties
            conn.sendall(b"\x30\x80\x80\x80\x64")  # PUBLISH, remaining length 200 MiB
            chunk = b"\x00" * 65536
            try:
                for _ in range(3200):
                    conn.sendall(chunk)
                    sent["bytes"] += len(chunk)
                    time.sleep(0.01)
            except OSError:
                return  # the agent closed the connection

    thread = threading.Thread(target=rogue, daemon=True)
    thread.start()
    ring = RingBuffer(64)
    config = make_config(tmp_path, Broker(tmp_path / "unused"), **{"mqtt.url": f"mqtt://127.0.0.1:{port}"})
    fwd, registry = run(config, ring)
    try:
        for seq in range(1, 6):
            ring.append(make_sample(seq))
        assert wait_until(
            lambda: metric(registry, "gpu_exporter_forward_connect_errors_total", kind="protocol") >= 1, 20
        )
        thread.join(20)
    finally:
        fwd.stop(5)
        server.close()
    assert not thread.is_alive()
    assert sent["bytes"] < 8 * 1024 * 1024  # cut off early, not after buffering 200 MiB
    assert spooled(fwd.config.spool_dir) == {1, 2, 3, 4, 5}  # nothing lost


@pytest.mark.parametrize("prefix", ["a/+/b", "gpu#", "x" * 70000, "tab\there"])
def test_a_topic_prefix_that_cannot_make_a_topic_is_a_usage_error(prefix: str) -> None:
    with pytest.raises(cfg.ConfigError, match="topic"):
        cfg.load({"mqtt.url": "mqtt://127.0.0.1:1883", "mqtt.topic-prefix": prefix}, environ={})
    cfg.load({"mqtt.url": "mqtt://127.0.0.1:1883", "mqtt.topic-prefix": "site-3/gpu-exporter"}, environ={})
