"""A clean stop of the real exporter process (SIGTERM, as the kubelet sends it) keeps every sample taken."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration.test_forward_cli import spooled_batches, spooled_seqs
from tests.support.agent_proc import Proc
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)

pytestmark = pytest.mark.integration


def collects(proc: Proc) -> int:
    for line in proc.scrape().splitlines():
        if line.startswith("gpu_exporter_collects_total "):
            return int(float(line.rpartition(" ")[2]))
    return 0


@pytest.mark.parametrize("broker_up", [True, False], ids=["broker-up", "broker-down"])
def test_sigterm_forwards_or_journals_every_sample_taken_the_last_one_included(
    tmp_path: Path, broker: Broker, broker_up: bool
) -> None:
    spool_dir = tmp_path / "spool"
    flags = [
        "--gpu-vendor=fake",
        "--fake.gpus=2",
        "--gpu-metrics-collection-interval=3s",  # a wide gap: no cycle falls between the count and the signal
        "--node-name=edge-1",
        f"--mqtt.url={broker.url}",
        f"--spool.dir={spool_dir}",
        "--mqtt.batch-interval=1h",  # the samples are all in the open batch when the signal comes
    ]
    with Collector(broker) as sub:
        proc = Proc(tmp_path, *flags).start()
        try:
            assert wait_until(lambda: sub.status.get("gpu-exporter/edge-1/status") == b"online", 10), proc.log()
            if not broker_up:
                broker.stop()
            assert wait_until(lambda: collects(proc) >= 2, 20)
            before = collects(proc)
            assert wait_until(lambda: collects(proc) > before, 10)  # just after a cycle: the next is 3 s away
            taken = collects(proc)
            assert proc.stop(signal.SIGTERM) == 0, proc.log()
        finally:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.stop(signal.SIGKILL)
        if broker_up:
            assert wait_until(lambda: len(sub.seqs()) == 1 and max(next(iter(sub.seqs().values()))) >= taken, 10)
        received = sub.seqs()
    boots = set(received) | {batch.boot for batch in spooled_batches(spool_dir)}
    assert len(boots) == 1, boots
    (boot,) = boots
    kept = received.get(boot, set()) | spooled_seqs(spool_dir, boot)
    # every sample of the run, 1..taken, either reached the broker or waits in the spool for the next start
    assert kept == set(range(1, taken + 1)), (sorted(kept), taken)
    if broker_up:
        assert received[boot] == set(range(1, taken + 1))  # connected: sent before exiting, not left behind
