"""The bridge at fleet scale (issue 22), through a real Mosquitto: messages arriving one at a time are
coalesced into few remote writes, within the latency bound of --bridge.write-linger; a bridge SIGKILLed
after writing and before its acknowledgements reached the broker, then restarted, writes nothing twice
into a real VictoriaMetrics (which stores exact duplicates twice) and loses nothing."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from gpu_exporter.bridge.convert import Converter
from gpu_exporter.model import DeviceId, DeviceSample, Sample
from gpu_exporter.payload import Batch, columns, encode
from tests.support.bridge_helpers import BridgeProcess, Publisher, ScriptedReceiver, make_batch
from tests.support.tcp_proxy import TcpProxy
from tests.support.tsdb import MosquittoServer, VictoriaMetricsServer, mosquitto_fixture, victoria_fixture, wait_until
from tests.unit.forward.test_forward_summary import decode_labels

victoria = victoria_fixture()


broker = mosquitto_fixture()


def _ok(n: int) -> tuple[int, bytes, dict[str, str]]:
    return 204, b"", {}


def _up_stamps(rx: ScriptedReceiver, node: str) -> list[int]:
    return [
        t
        for r in rx.requests
        for labels, points in r.series
        if ("node", node) in labels and ("__name__", "gpu_up") in labels
        for t, _ in points
    ]


def _wait_written(rx: ScriptedReceiver, node: str, stamps: list[int], bridge: BridgeProcess) -> None:
    """Wait until every stamp was written; else fail saying which are missing and what the bridge said."""
    try:
        wait_until(lambda: set(stamps) <= set(_up_stamps(rx, node)), 60, "every sample written")
    except TimeoutError:
        written = set(_up_stamps(rx, node))
        missing = [i for i, t in enumerate(stamps) if t not in written]
        counters = [line for line in bridge.page().decode().splitlines() if line.startswith("gpu_exporter_bridge_")]
        raise AssertionError(
            f"messages {missing} of {len(stamps)} never written ({len(rx.requests)} writes); bridge metrics:\n"
            + "\n".join(counters)
            + f"\nbridge log:\n{bridge.log.read_text()[-3000:]}"
        ) from None


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_messages_arriving_one_at_a_time_within_the_linger_are_written_together(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    node, now = "edge-coalesce", time.time() - 600
    with ScriptedReceiver(_ok) as rx:
        bridge = BridgeProcess(tmp_path, broker, rx.url, "coalesce", "--bridge.write-linger=8s").start()
        pub = Publisher(broker.port)
        try:
            for k in range(10):  # one message every 0.3 s: each finds the writer idle
                batch = make_batch(node, "b", [2 * k + 1, 2 * k + 2], now + 10 * k, gpus=1)
                pub.publish(f"gpu-exporter/{node}/batch", encode(batch))
                time.sleep(0.3)
            wait_until(lambda: len(_up_stamps(rx, node)) >= 20, 60, "all 20 samples written")
        finally:
            pub.close()
            bridge.stop()
    assert len(_up_stamps(rx, node)) == 20
    # without coalescing: one write per message (10)
    assert len(rx.requests) <= 2, f"{len(rx.requests)} remote writes for 10 messages"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_steady_stream_is_written_every_linger_not_held_until_it_stops(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    node, now = "edge-stream", time.time() - 600
    firsts: list[float] = []
    with ScriptedReceiver(_ok) as rx:
        bridge = BridgeProcess(tmp_path, broker, rx.url, "stream", "--bridge.write-linger=1s").start()
        pub = Publisher(broker.port)
        try:
            start = time.monotonic()
            k = 0
            while time.monotonic() - start < 8.0:  # a message every 0.2 s for 8 s: never a pause of 1 s
                batch = make_batch(node, "b", [k + 1], now + 5 * k, gpus=1)
                pub.publish(f"gpu-exporter/{node}/batch", encode(batch))
                if rx.requests and not firsts:
                    firsts.append(time.monotonic() - start)
                k += 1
                time.sleep(0.2)
            _wait_written(rx, node, [round((now + 5 * j) * 1000) for j in range(k)], bridge)
        finally:
            pub.close()
            bridge.stop()
    # A linger that restarted with each message would hold the whole stream until it stopped (one write).
    assert firsts, "nothing was written while the stream went on"
    assert len(rx.requests) >= 3, f"{len(rx.requests)} writes for an 8 s stream with a 1 s linger"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_batch_published_once_the_bridge_says_it_is_connected_is_written_even_over_a_slow_link(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    """``gpu_exporter_bridge_mqtt_connected`` 1 means receiving: over a link of 2 s each way, the
    subscription reaches the broker seconds after the CONNACK came back, and a first-time bridge has no
    session before it; a batch published in between would reach no one."""
    node = "edge-early"
    with ScriptedReceiver(_ok) as rx, TcpProxy(("127.0.0.1", broker.port)) as link:
        link.shape(latency=2.0)
        bridge = BridgeProcess(tmp_path, broker, rx.url, "early")
        bridge.args[0] = f"--mqtt.url=mqtt://127.0.0.1:{link.port}"
        bridge.start()  # returns once the gauge says connected
        pub = Publisher(broker.port)
        try:
            pub.publish(f"gpu-exporter/{node}/batch", encode(make_batch(node, "b", [1, 2], time.time() - 60, gpus=1)))
            wait_until(lambda: len(_up_stamps(rx, node)) >= 2, 30, "the batch written")
        finally:
            pub.close()
            bridge.stop()


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_bridge_killed_before_its_acknowledgements_arrived_writes_nothing_twice_after_its_restart(
    broker: MosquittoServer, victoria: VictoriaMetricsServer, tmp_path: Path
) -> None:
    node, now = "edge-kill", time.time() - 600
    batches = [make_batch(node, "boot-k", [3 * k + 1, 3 * k + 2, 3 * k + 3], now + 15 * k, gpus=2) for k in range(8)]
    state = tmp_path / "state"
    args = ("--bridge.write-linger=3s", f"--bridge.state-dir={state}")
    with TcpProxy(("127.0.0.1", broker.port)) as link:
        first = BridgeProcess(tmp_path, broker, victoria.write_url, "killed", *args)
        first.args[0] = f"--mqtt.url=mqtt://127.0.0.1:{link.port}"
        first.start()
        pub = Publisher(broker.port)
        try:
            for b in batches:
                pub.publish(f"gpu-exporter/{node}/batch", encode(b))
            wait_until(
                lambda: first.metric("gpu_exporter_bridge_messages_received_total") >= 8, 30, "the bridge received all"
            )
            # From here on the bridge's packets go nowhere: its PUBACKs never reach the broker.
            link.cut(silent=True)
            wait_until(lambda: first.metric("gpu_exporter_bridge_gpu_samples_written_total") >= 48, 60, "the write")
            first.stop(signal.SIGKILL)
            link.restore()
            again = BridgeProcess(tmp_path, broker, victoria.write_url, "killed", *args).start()
            try:
                # the broker delivers the 8 unacknowledged messages again, to the restarted session
                wait_until(
                    lambda: again.metric("gpu_exporter_bridge_messages_received_total") >= 8, 60, "the redelivery"
                )
                wait_until(
                    lambda: again.metric("gpu_exporter_bridge_queue_messages") == 0, 30, "the redelivery handled"
                )
                recognised = again.metric("gpu_exporter_bridge_duplicate_samples_total")
            finally:
                again.stop()
        finally:
            pub.close()
    stored = victoria.samples(f'gpu_up{{node="{node}"}}')
    assert len(stored) == 2  # two GPUs
    for points in stored.values():
        stamps = [t for t, _ in points]
        expected = sorted(round(s.timestamp * 1000) for b in batches for s in b.samples)
        assert stamps == expected, f"{len(stamps)} samples stored for {len(expected)} published"
    assert recognised == 24  # every redelivered sample, told apart as written before the kill


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_a_new_nodes_batches_coalesced_into_one_write_take_one_new_name_token(
    broker: MosquittoServer, tmp_path: Path
) -> None:
    node, now = "edge-newcomer", time.time() - 600
    with ScriptedReceiver(_ok) as rx:
        args = ("--bridge.write-linger=5s", "--bridge.new-nodes-per-minute=1", "--bridge.new-nodes-burst=1")
        bridge = BridgeProcess(tmp_path, broker, rx.url, "newcomer", *args).start()
        pub = Publisher(broker.port)
        try:
            for k in range(6):  # a name the bridge has not seen, no status message: it takes the one token
                pub.publish(f"gpu-exporter/{node}/batch", encode(make_batch(node, "b", [k + 1], now + 5 * k, gpus=1)))
            wait_until(lambda: bridge.metric("gpu_exporter_bridge_messages_received_total") >= 6, 30, "all received")
            wait_until(lambda: len(_up_stamps(rx, node)) >= 6, 30, "all six samples written")
            assert bridge.metric("gpu_exporter_bridge_new_nodes_refused_total") == 0
        finally:
            pub.close()
            bridge.stop()


def test_labels_composed_from_shared_recipes_are_exactly_the_series_labels_even_with_percent_signs() -> None:
    """An entry is composed with bytes formatting (recipe % device fields): a '%' in a label value, or a
    field of 37 bytes (0x25 is '%'), must come out as it went in."""
    odd = ("7%b9", "%" * 37, "x" * 35)
    batch = make_batch("edge-%d", "boot", [1, 2], time.time() - 60, gpus=2)
    doc = Batch(
        batch.node,
        batch.boot,
        tuple(
            Sample(
                s.seq,
                s.timestamp,
                tuple(
                    DeviceSample(
                        DeviceId(d.device.gpu, f"GPU-%{d.device.gpu}" + "u" * 30),
                        d.up,
                        {**d.values, **{("xid_errors", (v,)): 1.0 for v in odd}},
                        d.info,
                    )
                    for d in s.devices
                ),
            )
            for s in batch.samples
        ),
    )
    converter = Converter()
    for _ in range(2):  # the first batch makes the shared plan, the second reuses it
        got = {
            tuple(decode_labels(s.encoded_labels))
            for s in converter.convert([(columns.read(encode(doc)), None)]).series
        }
    want = {
        tuple(
            sorted(
                {
                    "__name__": "gpu_xid_errors_total",
                    "node": "edge-%d",
                    "gpu": str(g),
                    "uuid": f"GPU-%{g}" + "u" * 30,
                    "xid": v,
                }.items()
            )
        )
        for g in range(2)
        for v in odd
    }
    assert want <= got
    assert all(dict(labels)["node"] == "edge-%d" for labels in got)
