"""The exporter as a real process forwarding to a real Mosquitto: SIGKILL, TLS, credentials, bad flags."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter.forward.spool import Spool
from gpu_exporter.payload import Batch, decode
from tests.support import child_env, exporter_cmd
from tests.support.agent_proc import FAST, Proc
from tests.support.mosquitto import Broker, Collector, broker_fixture, make_tls, wait_until  # noqa: F401  (the broker fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        if p.proc is not None and p.proc.poll() is None:
            p.stop(signal.SIGKILL)


def run_exporter(procs: list[Proc], tmp_path: Path, *args: str) -> Proc:
    p = Proc(tmp_path, *args)
    procs.append(p)
    return p.start()


def spooled_batches(spool_dir: Path) -> list[Batch]:
    """The batches a stopped exporter's spool holds (spooled batches and the journal of the open one)."""
    spool = Spool(str(spool_dir), 1 << 40, 1e12)
    journal = spool.open()
    blobs = [data for _, data in journal]
    for entry in list(spool.entries()):
        data = spool.get(entry)
        assert data is not None
        blobs.append(data)
    spool.close()
    return [decode(data) for data in blobs]


def spooled_seqs(spool_dir: Path, boot: str) -> set[int]:
    """Sequence numbers of ``boot`` held in a stopped exporter's spool (batches and journal)."""
    return {s.seq for batch in spooled_batches(spool_dir) if batch.boot == boot for s in batch.samples}


def test_exporter_killed_during_an_outage_loses_no_sample(tmp_path: Path, broker: Broker, procs: list[Proc]) -> None:
    spool_dir = tmp_path / "spool"
    flags = [
        *FAST,
        f"--mqtt.url={broker.url}",
        f"--spool.dir={spool_dir}",
        "--mqtt.batch-interval=1s",
        "--mqtt.reconnect-max-delay=500ms",
        "--spool.replay-rate=50",
    ]
    with Collector(broker) as sub:
        first = run_exporter(procs, tmp_path, *flags)
        assert wait_until(lambda: len(sub.batches) >= 2, 15), first.log()
        boot = sub.batches[0].boot
        broker.stop()
        assert wait_until(lambda: first.metric("gpu_exporter_forward_connected") == 0, 10)
        time.sleep(5)  # ~25 samples at 200 ms, spooled and journaled
        assert first.metric('gpu_exporter_forward_connect_errors_total{kind="unreachable"}') >= 3  # retried
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        # an unreachable broker is one clear line, however many retries the outage took
        assert len(_problem_lines(first.log(), "refused the TCP connection")) == 1, first.log()
        held = spooled_seqs(spool_dir, boot)
        received = sub.seqs().get(boot, set())
        assert len(held - received) >= 15, "the outage should have left samples in the spool"
        last = max(held | received)

        broker.start()
        second = run_exporter(procs, tmp_path, *flags)
        assert wait_until(lambda: sub.seqs().get(boot, set()) >= set(range(1, last + 1)), 20), second.log()
        # nothing lost: every sample of the killed run, 1..last, arrived (the journal covers the open batch)
        assert set(range(1, last + 1)) <= sub.seqs()[boot]
        # the new run has its own boot id and starts at 1 again
        assert wait_until(lambda: len(sub.seqs()) == 2, 10)
        (new_boot,) = set(sub.seqs()) - {boot}
        assert min(sub.seqs()[new_boot]) == 1
        assert wait_until(lambda: second.metric("gpu_exporter_forward_spool_batches") == 0, 15)
        assert "Traceback" not in second.log()
        assert second.stop() == 0


def test_tls_with_client_certificate_and_password_file(tmp_path: Path, procs: list[Proc]) -> None:
    tls = make_tls(tmp_path / "tls")
    broker = Broker(
        tmp_path / "mosquitto",
        users={"edge": "s3cret", "cloud": "cl0ud"},
        tls={**tls, "require_certificate": "1"},
    )
    broker.start()
    try:
        (tmp_path / "password").write_text("s3cret\n")
        flags = [
            *FAST,
            f"--mqtt.url={broker.url}",
            f"--spool.dir={tmp_path / 'spool'}",
            "--mqtt.batch-interval=500ms",
            "--mqtt.username=edge",
            f"--mqtt.password-file={tmp_path / 'password'}",
            f"--mqtt.tls.ca-file={tls['ca']}",
            f"--mqtt.tls.cert-file={tls['client_cert']}",
            f"--mqtt.tls.key-file={tls['client_key']}",
        ]
        (tmp_path / "cloud-password").write_text("cl0ud\n")
        tail = subprocess.Popen(
            exporter_cmd(
                "tail",
                f"--mqtt.url={broker.url}",
                "--mqtt.username=cloud",
                f"--mqtt.password-file={tmp_path / 'cloud-password'}",
                f"--mqtt.tls.ca-file={tls['ca']}",
                f"--mqtt.tls.cert-file={tls['client_cert']}",
                f"--mqtt.tls.key-file={tls['client_key']}",
                "--count=2",
                "--timeout=30s",
            ),
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        time.sleep(1)  # let tail subscribe
        exporter = run_exporter(procs, tmp_path, *flags)
        out, err = tail.communicate(timeout=40)
        assert tail.returncode == 0, err.decode()
        rows = [json.loads(line) for line in out.decode().splitlines()]
        assert rows and {r["node"] for r in rows} == {"edge-1"}
        assert {r["gpu"] for r in rows} == {"0", "1"} and len({r["uuid"] for r in rows}) == 2
        assert all(r["values"]["gpu_memory_total_bytes"] > 0 for r in rows)
        seqs = sorted({r["seq"] for r in rows})
        assert seqs == list(range(seqs[0], seqs[-1] + 1))
        assert exporter.metric("gpu_exporter_forward_connected") == 1
        assert wait_until(lambda: exporter.metric("gpu_exporter_forward_published_batches_total") >= 3, 10)
        assert exporter.stop() == 0
    finally:
        broker.stop()


def _problem_lines(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line]


def test_wrong_password_is_one_log_line_and_the_exporter_keeps_working(tmp_path: Path, procs: list[Proc]) -> None:
    broker = Broker(tmp_path / "mosquitto", users={"edge": "right"})
    broker.start()
    try:
        (tmp_path / "password").write_text("wrong\n")
        exporter = run_exporter(
            procs,
            tmp_path,
            *FAST,
            f"--mqtt.url={broker.url}",
            f"--spool.dir={tmp_path / 'spool'}",
            "--mqtt.batch-interval=300ms",
            "--mqtt.reconnect-max-delay=300ms",
            "--mqtt.username=edge",
            f"--mqtt.password-file={tmp_path / 'password'}",
        )
        assert wait_until(lambda: exporter.metric('gpu_exporter_forward_connect_errors_total{kind="auth"}') >= 3, 15)
        assert wait_until(lambda: exporter.metric("gpu_exporter_forward_spool_batches") >= 3, 10)
        assert exporter.metric("gpu_exporter_forward_connected") == 0
        assert "gpu_utilization_ratio" in exporter.scrape()
        lines = _problem_lines(exporter.log(), "refused the credentials")
        assert len(lines) == 1, exporter.log()
        assert "user 'edge'" in lines[0] and "Traceback" not in exporter.log()
        # the right password arrives (a rotated secret): the backlog drains without a restart
        (tmp_path / "password").write_text("right\n")
        assert wait_until(lambda: exporter.metric("gpu_exporter_forward_connected") == 1, 10)
        assert wait_until(lambda: exporter.metric("gpu_exporter_forward_spool_batches") <= 1, 10)
        assert exporter.stop() == 0
    finally:
        broker.stop()


def test_untrusted_broker_certificate_is_one_log_line(tmp_path: Path, procs: list[Proc]) -> None:
    tls = make_tls(tmp_path / "tls", client=False)
    other = make_tls(tmp_path / "other-ca", client=False)
    broker = Broker(tmp_path / "mosquitto", tls=tls)
    broker.start()
    try:
        exporter = run_exporter(
            procs,
            tmp_path,
            *FAST,
            f"--mqtt.url={broker.url}",
            f"--spool.dir={tmp_path / 'spool'}",
            "--mqtt.reconnect-max-delay=300ms",
            f"--mqtt.tls.ca-file={other['ca']}",
        )
        assert wait_until(lambda: exporter.metric('gpu_exporter_forward_connect_errors_total{kind="tls"}') >= 3, 15)
        lines = _problem_lines(exporter.log(), "untrusted certificate")
        assert len(lines) == 1, exporter.log()
        assert re.search(r"self-signed|verify failed|local issuer", lines[0])
        assert exporter.stop() == 0
    finally:
        broker.stop()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--mqtt.url=http://broker:1883"], "invalid MQTT URL 'http://broker:1883'"),
        (["--mqtt.url=mqtt://user:pw@broker"], "--mqtt.password-file"),
        (["--mqtt.url=mqtts://broker", "--mqtt.tls.ca-file=/nonexistent/ca.pem"], "--mqtt.tls.ca-file=/nonexistent"),
        (["--mqtt.url=mqtts://broker", "--mqtt.tls.ca-file=/etc/hostname"], "--mqtt.tls.ca-file=/etc/hostname"),
        (["--mqtt.url=mqtt://broker", "--spool.max-bytes=lots"], "invalid size 'lots'"),
    ],
)
def test_bad_forwarding_flags_exit_2_with_one_line(tmp_path: Path, flags: list[str], message: str) -> None:
    result = subprocess.run(
        exporter_cmd(*FAST, f"--spool.dir={tmp_path}", *flags), env=child_env(), capture_output=True, timeout=30
    )
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_status_is_retained_online_and_the_will_says_offline_when_the_agent_dies(
    tmp_path: Path, broker: Broker, procs: list[Proc]
) -> None:
    flags = [*FAST, f"--mqtt.url={broker.url}", f"--spool.dir={tmp_path / 'spool'}", "--mqtt.keepalive=5s"]
    exporter = run_exporter(procs, tmp_path, *flags)
    with Collector(broker) as sub:  # subscribes after the fact: only a retained message can tell
        assert wait_until(lambda: sub.status.get("gpu-exporter/edge-1/status") == b"online", 10)
        exporter.stop(signal.SIGKILL)
        assert wait_until(lambda: sub.status.get("gpu-exporter/edge-1/status") == b"offline", 15)
