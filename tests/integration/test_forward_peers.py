"""Brokers worse than Mosquitto, met by the exporter as users run it (the CLI as a child process):
one that takes batches and never acknowledges them, one that sends a packet announced as 256 MB, and
a second agent that takes the first one's session over. Between agent and the real Mosquitto stands
tests/support/mqtt_proxy.py, which makes the broker misbehave. Each test ends with "nothing lost", checked by
sequence numbers end to end (what the broker delivered, and what the stopped agent left in its spool).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter.forward.spool import Spool
from tests.integration.test_forward_service import make_config, make_sample
from tests.support.agent_proc import FAST, Proc
from tests.support.mosquitto import Broker, Collector, wait_until
from tests.support.mqtt_proxy import Proxy

pytestmark = pytest.mark.integration

MIB = 1024 * 1024


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Broker, Proxy]]:
    broker = Broker(tmp_path / "mosquitto")
    broker.start()
    try:
        with Proxy(broker.port) as proxy:
            yield broker, proxy
    finally:
        broker.stop()


def left_in_spool(directory: Path) -> set[int]:
    """Sequence numbers a stopped agent left in its spool (batches and journal)."""
    spool = Spool(str(directory), 1 << 30, 1e9)
    journal = spool.open()
    seqs = {s for e in spool.entries() for s in range(e.first_seq, e.last_seq + 1)}
    spool.close()
    return seqs | {int(k.rsplit(".", 1)[1]) for k, _ in journal}


def nothing_lost(collector: Collector, spool: Path) -> None:
    """Every sample from 1 to the newest is at the broker or still in the stopped agent's spool."""
    (boot,) = collector.seqs() or {"": set()}
    got = collector.seqs().get(boot, set()) | left_in_spool(spool)
    assert got, "nothing was sampled"
    missing = set(range(1, max(got) + 1)) - got
    assert not missing, f"samples lost: {sorted(missing)[:20]}"


def agent(tmp_path: Path, proxy: Proxy, *extra: str) -> Proc:
    return Proc(
        tmp_path,
        *FAST,
        f"--mqtt.url={proxy.url}",
        f"--spool.dir={tmp_path / 'spool'}",
        "--mqtt.batch-interval=1s",
        "--mqtt.reconnect-max-delay=1s",
        *extra,
    )


def test_a_broker_that_never_acknowledges_shows_on_readyz_within_90s_and_loses_nothing(
    tmp_path: Path, proxied: tuple[Broker, Proxy]
) -> None:
    """Before: after 75 s, 62 batches waited and none was published while forwarding looked healthy."""
    broker, proxy = proxied
    proxy.swallow_pubacks = True  # the broker takes every batch, answers PINGREQ, and acknowledges nothing
    with Collector(broker) as sub:
        proc = agent(tmp_path, proxy).start()  # the default keepalive: 30 s
        started = time.monotonic()
        try:
            assert wait_until(lambda: proxy.wire.pubacks_swallowed >= 1, 20)

            def unready() -> bool:
                return http_status(proc, "/readyz") == 503

            assert wait_until(unready, 100, interval=1.0), proc.log()
            took = time.monotonic() - started
            assert took <= 90, f"/readyz stayed ready for {took:.0f}s"
            body = http_body(proc, "/readyz")
            assert "no PUBACK" in body and f"127.0.0.1:{proxy.port}" in body, body
            assert wait_until(lambda: "acknowledged none of" in proc.log(), 10)  # one line in the log says why
            # counted just after the line is logged (on a loaded machine the page can be read in between)
            assert wait_until(lambda: proc.metric('gpu_exporter_forward_connect_errors_total{kind="timeout"}') >= 1, 10)
            assert proc.metric("gpu_exporter_forward_working") == 0
            proxy.swallow_pubacks = False  # the broker is fixed (or restarted): a new connection works
            proxy.drop_connections()
            assert wait_until(lambda: http_status(proc, "/readyz") == 200, 30, interval=0.5), proc.log()
            assert wait_until(lambda: proc.metric("gpu_exporter_forward_spool_batches") == 0, 30, interval=0.5)
        finally:
            proc.stop()
    nothing_lost(sub, tmp_path / "spool")


def test_a_packet_announced_as_256_mb_costs_the_agent_less_than_100_mb_and_loses_nothing(
    tmp_path: Path, proxied: tuple[Broker, Proxy]
) -> None:
    """Before: the agent buffered 92-268 MB per connection (peak 1.06 GB) before it cut the connection."""
    broker, proxy = proxied
    proxy.flood, proxy.flood_connections = 256_000_000, 3  # three connections in a row get the 256 MB PUBLISH
    with Collector(broker) as sub:
        proc = agent(tmp_path, proxy).start()
        try:
            assert wait_until(
                lambda: proc.metric('gpu_exporter_forward_connect_errors_total{kind="protocol"}') >= 3, 60
            )
            assert wait_until(lambda: proc.metric("gpu_exporter_forward_published_batches_total") >= 3, 30)
            peak = peak_rss(proc)
        finally:
            proc.stop()
    assert peak < 100 * MIB, f"peak RSS {peak / MIB:.0f} MiB"
    assert "over the 65536 the agent announced as its Maximum Packet Size" in proc.log()
    with proxy.wire.lock:
        assert proxy.wire.flooded < 16 * MIB  # what the kernel's buffers took, not what the agent kept
    nothing_lost(sub, tmp_path / "spool")


def test_a_session_taken_over_is_said_plainly_and_loses_nothing(
    tmp_path: Path, proxied: tuple[Broker, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    """MQTT 5 DISCONNECT with reason 0x8E (Session taken over), as a broker sends it when a second agent
    connects with the same client id: said as what it is. Before: "lost: Unspecified error"."""
    from prometheus_client import CollectorRegistry

    from gpu_exporter.forward.service import Forwarder
    from gpu_exporter.ring import RingBuffer

    broker, proxy = proxied
    caplog.set_level(logging.WARNING, "gpu_exporter.forward")
    ring = RingBuffer(64)
    with Collector(broker) as sub:
        fwd = Forwarder(make_config(tmp_path, broker, **{"mqtt.url": proxy.url}), ring, CollectorRegistry())
        fwd.start()
        try:
            assert wait_until(lambda: fwd.link.up, 10)
            proxy.take_over()
            assert wait_until(lambda: "session taken over" in caplog.text, 10), caplog.text
            for seq in range(1, 6):
                ring.append(make_sample(seq))
            assert wait_until(lambda: sub.seqs().get(fwd.boot) == {1, 2, 3, 4, 5}, 20)  # nothing lost
        finally:
            fwd.stop(5)
    (line,) = [r.getMessage() for r in caplog.records if "session taken over" in r.getMessage()]
    assert "'gpu-exporter-node-a'" in line and "--node-name" in line
    assert "Unspecified error" not in caplog.text


def test_a_twin_agent_on_a_broker_that_closes_without_a_word_is_named_as_a_cause(
    tmp_path: Path, proxied: tuple[Broker, Proxy], caplog: pytest.LogCaptureFixture
) -> None:
    """Debian's Mosquitto 2.0.11 closes the first agent's connection without a DISCONNECT when a second one
    connects with the same client id: the line names that among the causes, with the client id."""
    from prometheus_client import CollectorRegistry

    from gpu_exporter.forward.service import Forwarder
    from gpu_exporter.ring import RingBuffer

    broker, _ = proxied
    caplog.set_level(logging.WARNING, "gpu_exporter.forward")
    first = Forwarder(make_config(tmp_path, broker), RingBuffer(8), CollectorRegistry())
    first.start()
    try:
        assert wait_until(lambda: first.link.up, 10)
        second = Forwarder(make_config(tmp_path / "twin", broker), RingBuffer(8), CollectorRegistry())
        second.start()
        try:
            assert wait_until(lambda: "closed without a DISCONNECT" in caplog.text, 15), caplog.text
        finally:
            second.stop(5)
    finally:
        first.stop(5)
    line = next(r.getMessage() for r in caplog.records if "closed without a DISCONNECT" in r.getMessage())
    assert "another client connecting with the client id 'gpu-exporter-node-a'" in line
    assert "Unspecified error" not in caplog.text


def http_status(proc: Proc, path: str) -> int:
    from tests.support import http_get

    try:
        return http_get(f"http://127.0.0.1:{proc.port}{path}", timeout=5)[0]
    except OSError:
        return 0


def http_body(proc: Proc, path: str) -> str:
    from tests.support import http_get

    return http_get(f"http://127.0.0.1:{proc.port}{path}", timeout=5)[1].decode()


def peak_rss(proc: Proc) -> int:
    assert proc.proc is not None
    with open(f"/proc/{proc.proc.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")
