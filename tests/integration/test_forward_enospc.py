"""A really full disk (ENOSPC on a small tmpfs), not a simulated one.

The spool on its own, then the exporter as a process. A spool that fills its own disk leaves a reserve
free and drops its oldest batches instead of wedging SQLite. When something else takes the last free
block, a full disk never raises, every refused batch is held in memory or counted, and once there is room
again the spool writes, forgets acknowledged batches and keeps what it held across a restart. Mounting
needs root or CAP_SYS_ADMIN; without it these tests skip. The tmpfs is unmounted at teardown whatever
happened.
"""

from __future__ import annotations

import errno
import gc
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from gpu_exporter.forward.spool import Spool
from gpu_exporter.forward.spool_index import Entry
from tests.support.agent_proc import FAST, Proc
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)
from tests.unit.forward.test_forward_spool import Drops

FS_SIZE = 4 * 1024 * 1024  # room for SQLite to open and hold a few MiB of batches
SMALL, LARGE = 16 * 1024, 96 * 1024  # a batch kept inside SQLite, and one diskcache keeps as a value file


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs of its own (skips where mounting is not permitted), always unmounted afterwards."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("mount(8) is not installed")
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_SIZE},mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        timeout=30,
    )
    if result.returncode != 0 or not os.path.ismount(mnt):
        lines = result.stderr.decode(errors="replace").strip().splitlines()
        reason = lines[0] if lines else f"exit status {result.returncode}"
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {reason}")
    try:
        yield mnt
    finally:
        gc.collect()  # SQLite connections a failed test left open
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode != 0:
            subprocess.run(["umount", "--lazy", str(mnt)], check=True, capture_output=True, timeout=30)
        assert not os.path.ismount(mnt)


def fill(path: Path) -> int:
    """Write ``path`` until the filesystem refuses (ENOSPC); returns the bytes it holds."""
    chunk = b"\xa5" * (64 * 1024)
    written = 0
    with open(path, "wb", buffering=0) as handle:
        for _ in range(FS_SIZE // len(chunk) + 2):
            try:
                written += handle.write(chunk) or 0
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        else:
            raise AssertionError(f"{path.parent} never filled up")
    assert os.statvfs(path.parent).f_bavail == 0
    return written


def fill_to_the_last_block(spool_dir: Path, tenant: Path) -> None:
    """Another tenant of the disk takes every free block, right after the spool's WAL was checkpointed and
    truncated: SQLite has no room left to write into, not even to delete a row, so the spool's reserve
    cannot help and every write is refused."""
    with closing(sqlite3.connect(spool_dir / "cache.db")) as con:
        assert con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy
    fill(tenant)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


class Filler:
    """Puts numbered batches (alternately small and large, 3 samples each) and remembers their bytes."""

    def __init__(self, spool: Spool) -> None:
        self.spool = spool
        self.entries: list[Entry] = []
        self.data: dict[int, bytes] = {}
        self.refused = 0  # batches the disk refused (the spool held them in memory)

    def put(self) -> Entry:
        n = len(self.entries) + 1
        data = os.urandom(LARGE if n % 2 == 0 else SMALL)
        errors = self.spool.write_errors
        entry = self.spool.put(data, first_seq=3 * n - 2, last_seq=3 * n, samples=3)
        self.refused += self.spool.write_errors > errors
        self.entries.append(entry)
        self.data[entry.first_seq] = data
        return entry

    def then_fill_the_disk(self, batches: int, tenant: Path) -> None:
        """Put ``batches`` batches, then let another tenant take the disk to its last block."""
        for _ in range(batches):
            self.put()
        fill_to_the_last_block(Path(self.spool.directory), tenant)

    def until_refused(self, refused: int) -> None:
        """Put until the disk has refused ``refused`` batches (the loop is bounded: 4 MiB cannot hold 400)."""
        for _ in range(400):
            self.put()
            if self.refused >= refused:
                return
        raise AssertionError(f"the disk never refused a write: {self.spool.write_errors} errors")

    def held(self) -> list[Entry]:
        return [e for e in self.entries if e in self.spool]

    def readable(self, spool: Spool, entries: list[Entry]) -> bool:
        return all(spool.get(e) == self.data[e.first_seq] for e in entries)


def reopen(directory: Path, drops: Drops | None = None) -> Spool:
    spool = Spool(str(directory), max_bytes=1 << 40, max_age=1e9, on_drop=drops)
    spool.open()
    return spool


def value_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*.val") if "corrupt" not in p.parts]


def test_a_full_disk_never_raises_and_every_batch_is_held_or_counted(small_fs: Path) -> None:
    tenant = small_fs / "tenant"  # another tenant of the disk; it gives its space back later
    drops = Drops()
    spool = reopen(small_fs / "spool", drops)
    try:
        filler = Filler(spool)
        on_disk = [filler.put() for _ in range(6)]
        fill_to_the_last_block(small_fs / "spool", tenant)
        # the disk refuses every batch, then the memory the spool falls back on (8 MiB) overflows
        for _ in range(400):  # up to 400 x 56 KiB
            filler.put()
            if drops.batches.get("disk_full", 0) >= 5:
                break
        assert filler.refused == len(filler.entries) - len(on_disk)
        assert spool.write_errors == filler.refused  # each refusal counted once
        assert "No space left on device" in spool.disk_error or "disk is full" in spool.disk_error
        held = filler.held()
        assert drops.batches.get("disk_full", 0) >= 5, drops.batches
        assert set(drops.batches) == {"disk_full"}
        assert len(held) + drops.batches["disk_full"] == len(filler.entries)  # nothing vanished uncounted
        assert drops.samples["disk_full"] == 3 * drops.batches["disk_full"]
        assert filler.readable(spool, held)  # what was written before the disk filled up, and since
        assert held[: len(on_disk)] == on_disk, "the batches on disk are the last to go"

        # The other tenant frees its space and the broker takes everything: the disk takes writes again.
        tenant.unlink()
        for entry in held:
            assert spool.remove(entry)
        errors = spool.write_errors
        fresh = [filler.put() for _ in range(8)]  # 8 x 56 KiB: 448 KiB
        assert spool.write_errors == errors, spool.disk_error
        assert len(spool) == len(fresh) and filler.readable(spool, fresh)
    finally:
        spool.close()
    again = reopen(small_fs / "spool")
    try:
        assert [e.first_seq for e in again.entries()] == [e.first_seq for e in fresh]
        assert filler.readable(again, fresh)
    finally:
        again.close()


def test_once_there_is_room_again_a_restart_loses_nothing_the_spool_held(small_fs: Path) -> None:
    tenant = small_fs / "tenant"
    drops = Drops()
    spool = reopen(small_fs / "spool", drops)
    try:
        filler = Filler(spool)
        filler.then_fill_the_disk(3, tenant)
        filler.until_refused(6)  # six batches the disk refused: kept in memory
        held = filler.held()
        assert held == filler.entries and not drops.batches
        tenant.unlink()
    finally:
        spool.close()  # a restart (or an upgrade) after the disk recovered, before the broker came back
    again = reopen(small_fs / "spool", drops)
    try:
        assert [e.first_seq for e in again.entries()] == [e.first_seq for e in held]
        assert filler.readable(again, list(again.entries()))
        assert not drops.batches
    finally:
        again.close()


def test_batches_acknowledged_while_the_disk_is_full_are_not_sent_again_nor_leak_files(small_fs: Path) -> None:
    tenant = small_fs / "tenant"
    spool = reopen(small_fs / "spool")
    try:
        filler = Filler(spool)
        filler.then_fill_the_disk(4, tenant)
        filler.until_refused(6)
        errors = spool.write_errors
        for entry in filler.held():  # the broker is back and acknowledges everything, the disk still full
            assert spool.remove(entry)
        assert spool.write_errors == errors + 4  # the deletes of the four batches on disk, refused
        assert len(spool) == 0 and spool.total_bytes == 0
        tenant.unlink()
        fresh = filler.put()  # the next batch, now that there is room
        assert fresh in spool and filler.readable(spool, [fresh])
    finally:
        spool.close()
    again = reopen(small_fs / "spool")
    try:
        # a restart must not send the acknowledged batches a second time
        assert [e.first_seq for e in again.entries()] == [fresh.first_seq]
        again.remove(fresh)
    finally:
        again.close()
    # and the refused writes left no value files behind to keep the disk full
    assert value_files(small_fs / "spool") == []


def test_a_restart_on_a_full_disk_keeps_the_spool(small_fs: Path) -> None:
    tenant = small_fs / "tenant"
    drops = Drops()
    spool = reopen(small_fs / "spool", drops)
    try:
        filler = Filler(spool)
        filler.then_fill_the_disk(3, tenant)
        filler.until_refused(3)
        assert filler.held() == filler.entries
    finally:
        spool.close()  # what the disk still refuses, held in memory, is gone: counted
    lost = drops.batches.get("disk_full", 0)
    assert 1 <= lost <= 3 and drops.samples == {"disk_full": 3 * lost}

    full = reopen(small_fs / "spool", drops)  # the exporter restarts while the disk is still full
    try:
        full.put(b"while full", 10_000, 10_000, 1)  # refused or not: never raised
    finally:
        full.close()
    assert not (small_fs / "spool" / "corrupt").exists(), "a full disk is not a corrupt database"
    assert "corrupt" not in drops.batches and "corrupt" not in drops.samples

    tenant.unlink()
    again = reopen(small_fs / "spool", drops)
    try:
        kept = [e for e in again.entries() if e.first_seq < 10_000]
        assert len(kept) + lost == len(filler.entries)  # every batch of the first run is back, or counted
        assert {e.first_seq for e in kept} <= set(filler.data)
        assert filler.readable(again, kept)
    finally:
        again.close()


def test_a_spool_that_fills_its_own_disk_drops_its_oldest_batches_and_keeps_working(small_fs: Path) -> None:
    """--spool.max-bytes larger than the volume: rather than take the last free block (SQLite then could
    neither checkpoint nor delete a row), the spool leaves a reserve free and drops its oldest batches."""
    drops = Drops()
    spool = Spool(str(small_fs / "spool"), max_bytes=64 << 20, max_age=1e9, on_drop=drops)  # more than the disk
    spool.open()
    try:
        filler = Filler(spool)
        for _ in range(300):  # broker down: 300 batches of 16 and 96 KiB, about 16 MiB on a 4 MiB disk
            filler.put()
            spool.expire()  # the forwarder's housekeeping, every second
        assert spool.write_errors == 0, spool.disk_error  # the disk never refused a write
        dropped = drops.batches.get("disk_full", 0)
        assert set(drops.batches) == {"disk_full"} and drops.samples["disk_full"] == 3 * dropped
        kept = list(spool.entries())
        assert dropped >= 200 and kept == filler.entries[dropped:]  # the oldest went, every other is kept
        assert filler.readable(spool, kept)
        assert free_bytes(small_fs) >= 512 * 1024  # the reserve (1 MiB here), less what a batch may take

        for entry in kept:  # the broker comes back and acknowledges everything: space is given back
            assert spool.remove(entry)
        assert free_bytes(small_fs) >= FS_SIZE - 1024 * 1024
        fresh = [filler.put() for _ in range(10)]  # and new batches are stored, without a restart
        spool.expire()
        assert spool.write_errors == 0, spool.disk_error
        assert list(spool.entries()) == fresh and filler.readable(spool, fresh)
        assert drops.batches["disk_full"] == dropped  # nothing more than needed
    finally:
        spool.close()
    again = reopen(small_fs / "spool")
    try:
        assert [e.first_seq for e in again.entries()] == [e.first_seq for e in fresh]
    finally:
        again.close()


def test_a_spool_gives_up_its_oldest_batches_to_another_tenant_filling_the_disk(small_fs: Path) -> None:
    """Something else fills the disk, slowly: the spool drops its oldest batches (counted) so that it keeps
    its reserve, and stays able to store new batches and forget acknowledged ones."""
    drops = Drops()
    spool = reopen(small_fs / "spool", drops)
    try:
        filler = Filler(spool)
        for _ in range(20):  # 1.1 MiB
            filler.put()
        assert not drops.batches
        with open(small_fs / "tenant", "wb") as tenant:
            for _ in range(24):  # 2.25 MiB more: less than 1 MiB would be left
                tenant.write(b"\xa5" * (96 * 1024))
                tenant.flush()
                spool.expire()
        assert spool.write_errors == 0, spool.disk_error
        dropped = drops.batches.get("disk_full", 0)
        assert 0 < dropped < 20 and list(spool.entries()) == filler.entries[dropped:]
        assert free_bytes(small_fs) >= 1024 * 1024 - 128 * 1024  # the reserve, within a page or two
        fresh = filler.put()
        assert fresh in spool and spool.write_errors == 0, spool.disk_error
        for entry in list(spool.entries()):
            assert spool.remove(entry)
        assert spool.write_errors == 0 and len(spool) == 0
    finally:
        spool.close()


# ----------------------------------------------------------------------------------------- the exporter


@pytest.mark.integration
def test_the_exporter_on_a_full_disk_keeps_serving_and_every_sample_arrives_or_is_counted(
    tmp_path: Path, small_fs: Path, broker: Broker
) -> None:
    flags = [
        *FAST,
        f"--mqtt.url={broker.url}",
        f"--spool.dir={small_fs / 'spool'}",
        "--mqtt.batch-interval=500ms",
        "--mqtt.reconnect-max-delay=500ms",
        "--spool.replay-rate=50",
    ]
    agent = Proc(tmp_path, *flags)
    with Collector(broker) as sub:
        broker.stop()  # the collector's session (and what is queued for it) survives the outage
        agent.start()
        try:
            assert wait_until(lambda: agent.metric("gpu_exporter_forward_spool_batches") >= 2, 15), agent.log()
            fill(small_fs / "ballast")  # the disk is full: spool and journal writes are refused
            assert wait_until(lambda: agent.metric("gpu_exporter_forward_spool_write_errors_total") >= 10, 15)
            for _ in range(10):  # the exporter keeps serving its metrics while the disk is full
                assert "gpu_utilization_ratio" in agent.scrape()
                time.sleep(0.2)

            broker.start()  # the broker comes back, the disk still full
            assert wait_until(lambda: agent.metric("gpu_exporter_forward_connected") == 1, 15), agent.log()
            assert wait_until(lambda: agent.metric("gpu_exporter_forward_spool_batches") <= 1, 15), agent.log()

            (small_fs / "ballast").unlink()  # room again: writes succeed, the error count stops growing
            time.sleep(1.0)
            errors = agent.metric("gpu_exporter_forward_spool_write_errors_total")
            time.sleep(2.0)  # 10 samples, 4 batches
            assert agent.metric("gpu_exporter_forward_spool_write_errors_total") == errors, agent.log()

            final = agent.metrics()
            assert 'gpu_exporter_forward_dropped_samples_total{reason="disk_full"}' in final
            lost = final["gpu_exporter_forward_missed_samples_total"] + sum(
                v for k, v in final.items() if k.startswith("gpu_exporter_forward_dropped_samples_total{")
            )
            assert agent.stop() == 0, agent.log()  # the last batch leaves with it
        finally:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.stop(signal.SIGKILL)
        (boot,) = sub.seqs()
        published = final["gpu_exporter_forward_published_samples_total"]
        assert wait_until(lambda: sub.caught_up(boot, published), 15)
        assert wait_until(lambda: len(sub.seqs()[boot]) + lost >= max(sub.seqs()[boot]), 10)
        got = sub.seqs()[boot]
        missing = set(range(1, max(got) + 1)) - got
        assert len(missing) == lost, f"{len(missing)} samples never arrived, {lost} counted as lost"
        assert max(got) >= 40  # ~10 s of samples at 200 ms
    leftover = Spool(str(small_fs / "spool"), 1 << 40, 1e12)
    try:  # nothing delivered stays behind to be sent again by the next start
        assert leftover.open() == [] and len(leftover) == 0
    finally:
        leftover.close()
    log = agent.log()
    assert "Traceback" not in log, log
    assert "are lost" not in log, log  # nothing was still held in memory only when it stopped
    refused = [line for line in log.splitlines() if "spool" in line and "failed" in line]
    assert 1 <= len(refused) <= 3, "\n".join(refused[:20])  # a clear line, not one per sample or batch
