"""The bridge bounded in bytes, end to end (issue 20), with a real Mosquitto: the Maximum Packet Size it
announces keeps larger messages at the broker; what it holds unacknowledged is bounded in messages and
bytes by its own account (paho's thread waits, the broker keeps the rest), also past a reconnection;
nothing is lost and nothing written twice; a compression bomb stops at the inflate limit."""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpu_exporter.bridge.inflight import Inflight
from gpu_exporter.bridge.service import Bridge, Received
from gpu_exporter.bridge.settings import BridgeSettings
from gpu_exporter.payload import columns, encode
from tests.support.bridge_attacks import bomb, junk_document, local_bridge, peak_rss, rss, series_flood, value
from tests.support.bridge_helpers import BridgeProcess, Publisher, ScriptedReceiver, make_batch
from tests.support.tsdb import MosquittoServer, mosquitto_fixture, wait_until

MiB = 1 << 20


class Switch:
    """A remote-write receiver's answers: 503 while ``down``, else 204."""

    def __init__(self) -> None:
        self.down = True
        self.accepted: set[int] = set()  # request numbers answered 204

    def __call__(self, n: int) -> tuple[int, bytes, dict[str, str]]:
        if self.down:
            return 503, b"down", {}
        self.accepted.add(n)
        return 204, b"", {}


def _timestamps(rx: ScriptedReceiver, node: str, switch: Switch | None = None) -> list[int]:
    """The timestamps of ``node``'s gpu_up samples the receiver accepted, in request order."""
    return [
        t
        for n, r in enumerate(rx.requests, 1)
        if switch is None or n in switch.accepted
        for labels, points in r.series
        if ("node", node) in labels and ("__name__", "gpu_up") in labels
        for t, _ in points
    ]


broker = mosquitto_fixture()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_message_flood_while_remote_write_fails_is_held_in_bytes_and_nothing_is_lost(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    switch = Switch()
    node = "edge-flood"
    now = time.time()
    valid = make_batch(node, "b", [1, 2], now - 30, gpus=1)
    junk = junk_document(node, 2_000_000, int(now * 1000))  # plain JSON of empty arrays: 21x its size parsed
    args = ("--bridge.max-inflight-bytes=8MiB", "--bridge.max-payload=3MiB")
    with ScriptedReceiver(switch) as rx:
        bridge = BridgeProcess(tmp_path, broker, rx.url, "bounded", *args).start()
        assert bridge.proc is not None
        pub = Publisher(broker.port)
        try:
            pub.publish(f"gpu-exporter/{node}/batch", encode(valid))
            wait_until(lambda: len(rx.requests) >= 2, 20, "the writer retrying")
            before = rss(bridge.proc.pid)
            for _ in range(30):
                pub.publish(f"gpu-exporter/{node}/batch", junk)
            time.sleep(3)  # what the bridge would take arrives meanwhile
            held_bytes = bridge.metric("gpu_exporter_bridge_queue_bytes")
            held = bridge.metric("gpu_exporter_bridge_queue_messages")
            grown = rss(bridge.proc.pid) - before
            assert held_bytes <= 8 * MiB and held <= 5, (held_bytes, held)
            assert grown < 40 * MiB, f"the bridge grew by {grown / MiB:.0f} MiB holding {held:.0f} messages"
            switch.down = False
            wait_until(
                lambda: (
                    bridge.metric("gpu_exporter_bridge_messages_received_total") == 31
                    and bridge.metric("gpu_exporter_bridge_queue_messages") == 0
                ),
                120,
                "every message",
                interval=0.5,
            )
            assert peak_rss(bridge.proc.pid) - before < 120 * MiB  # one 2 MB message decoded at a time
        finally:
            pub.close()
            bridge.stop()
    assert _timestamps(rx, node, switch) == [round(s.timestamp * 1000) for s in valid.samples]
    # everything was acknowledged: the same session holds nothing any more
    again = Bridge(
        BridgeSettings(mqtt_url=broker.url, remote_write_url=rx.url, client_id="bounded"), CollectorRegistry()
    )
    again.start()
    try:
        assert again.wait_connected(10)
        time.sleep(1.0)
        assert again.metrics.messages._value.get() == 0
    finally:
        again.stop(5)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_bound_holds_whatever_the_broker_sends_and_survives_a_reconnection(
    broker: MosquittoServer, caplog: pytest.LogCaptureFixture
) -> None:
    # The broker knows nothing of the bridge's byte bound (and Mosquitto 2.0.11 does not always hold to
    # Receive Maximum): the bridge's own account stops paho. While paho's thread waits it sends no
    # keep-alive; with a 2 s keep-alive the broker drops the connection, and on reconnecting sends the
    # unacknowledged messages again.
    switch = Switch()
    node = "edge-reconnect"
    now = time.time()
    batches = [make_batch(node, "b", [2 * i + 1, 2 * i + 2], now - 100 + 10 * i, gpus=8) for i in range(10)]
    payloads = [encode(b) for b in batches]
    bound = 2 * max(map(len, payloads)) + 1  # two messages at most
    registry = CollectorRegistry()
    with ScriptedReceiver(switch) as rx:
        settings = BridgeSettings(
            mqtt_url=broker.url,
            remote_write_url=rx.url,
            client_id="reconnect",
            receive_maximum=20,
            max_inflight_bytes=bound,
            keepalive=2,
            rw_backoff_max=0.2,
        )
        bridge = Bridge(settings, registry)
        bridge.start()
        pub = Publisher(broker.port)
        most = [0, 0]
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                held = bridge.inflight.usage()
                most[:] = max(most[0], held[0]), max(most[1], held[1])
                time.sleep(0.01)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            assert bridge.wait_connected(10)
            for p in payloads:
                pub.publish(f"gpu-exporter/{node}/batch", p)
            time.sleep(8)  # well past 1.5 keep-alives: the broker has dropped the waiting bridge
            switch.down = False
            want = sorted(round(s.timestamp * 1000) for b in batches for s in b.samples for _ in range(8))
            wait_until(lambda: sorted(_timestamps(rx, node, switch)) == want, 60, "every sample")
            time.sleep(1.0)
        finally:
            watching.set()
            watcher.join()
            pub.close()
            bridge.stop(5)
    assert most[0] <= 2 and most[1] <= bound, most
    assert sorted(_timestamps(rx, node, switch)) == want  # each sample once
    assert value(registry, "gpu_exporter_bridge_inflight_wait_seconds_total") > 2
    assert any("reconnecting" in r.getMessage() for r in caplog.records)  # the broker did drop the bridge
    # and sent again what it had not had acknowledged: skipped while held, else recognised as replays
    again = value(registry, "gpu_exporter_bridge_redeliveries_skipped_total")
    assert again + value(registry, "gpu_exporter_bridge_duplicate_samples_total") > 0


def test_a_redelivery_of_a_held_message_is_skipped_and_acknowledged_once() -> None:
    stop = threading.Event()
    account = Inflight(max_messages=10, max_bytes=1000, stop=stop)
    first = Received(5, 1, "t/n/batch", b"x" * 10)
    assert account.admit(first, dup=False)
    assert not account.admit(Received(5, 1, "t/n/batch", b"x" * 10), dup=True)  # sent again after a reconnect
    assert account.redelivered == 1 and account.usage() == (1, 10)
    # a new message under the same packet id: the broker had the first one's acknowledgement already
    reused = Received(5, 1, "t/n/batch", b"y" * 20)
    assert account.admit(reused, dup=False)
    assert account.claim([first, reused]) == [reused]  # one acknowledgement for packet id 5, not two
    account.release([first, reused])
    assert account.usage() == (0, 0)


def test_paho_waits_at_the_bound_until_the_writer_releases() -> None:
    stop = threading.Event()
    account = Inflight(max_messages=2, max_bytes=1000, stop=stop)
    held = [Received(i, 1, "t/n/batch", b"x" * 400) for i in (1, 2)]
    for m in held:
        assert account.admit(m, dup=False)
    third = Received(3, 1, "t/n/batch", b"x" * 100)
    done = threading.Event()
    threading.Thread(target=lambda: (account.admit(third, dup=False), done.set()), daemon=True).start()
    assert not done.wait(0.5)  # full in messages: paho's thread waits, reading nothing
    account.release(held[:1])
    assert done.wait(5)
    big = Received(4, 1, "t/n/batch", b"x" * 600)  # 400 + 100 + 600 > 1000 bytes
    waiting = threading.Thread(target=account.admit, args=(big, False), daemon=True)
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()
    stop.set()  # stopping: the waiting message is left to the broker
    waiting.join(5)
    assert not waiting.is_alive() and account.usage() == (2, 500)


@pytest.mark.integration
def test_the_broker_keeps_messages_over_the_announced_packet_size(broker: MosquittoServer) -> None:
    now = time.time()
    node = "edge-big"
    registry = CollectorRegistry()
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        settings = BridgeSettings(
            mqtt_url=broker.url, remote_write_url=rx.url, client_id="small", max_payload=64 * 1024
        )  # announces 128 KiB
        bridge = Bridge(settings, registry)
        bridge.start()
        pub = Publisher(broker.port)
        try:
            assert bridge.wait_connected(10)
            pub.publish(f"gpu-exporter/{node}/batch", os.urandom(200_000))  # over the packet size
            pub.publish(f"gpu-exporter/{node}/batch", os.urandom(100_000))  # over the payload limit only
            pub.publish(f"gpu-exporter/{node}/batch", encode(make_batch(node, "b", [1], now - 5)))
            wait_until(lambda: _timestamps(rx, node), 20, "the valid batch")
            time.sleep(0.5)
        finally:
            pub.close()
            bridge.stop(5)
    assert value(registry, "gpu_exporter_bridge_messages_received_total") == 2
    assert value(registry, "gpu_exporter_bridge_payloads_dropped_total", node=node, reason="oversized") == 1


def test_a_compression_bomb_stops_at_the_inflate_limit() -> None:
    payload = bomb("edge-bomb", 16 * MiB, int(time.time() * 1000))
    assert len(payload) < 20_000
    with ScriptedReceiver(lambda n: (204, b"", {})) as rx:
        bridge, registry = local_bridge(rx.url, max_payload=16 * MiB)
        tracemalloc.start()
        try:
            bridge.process([Received(1, 1, "gpu-exporter/edge-bomb/batch", payload)])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert value(registry, "gpu_exporter_bridge_payloads_dropped_total", node="edge-bomb", reason="oversized") == 1
    assert peak < 8 * MiB, f"decoding a {len(payload)}-byte bomb took {peak / MiB:.0f} MiB"
    assert not rx.requests


def test_decoded_floods_of_series_leave_nothing_behind() -> None:
    """The decoder remembers the last few metrics lists to skip checking them again; a flood's lists of
    thousands of distinct series must not be among them (eight kept took 110 MB more of the bridge's
    peak RSS in bench/bench_bridge_attack.py's series20, over its 300 MB bound)."""
    gc.collect()
    msgs = series_flood([f"edge-{i}" for i in range(4)], 40_000, time.time() - 60)  # 10,000 series a message
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _, payload in msgs:
            columns.read(payload)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 2 * MiB, f"{kept / MiB:.1f} MiB kept after decoding"
