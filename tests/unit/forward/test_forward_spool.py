"""The spool on its own: caps, order, restart, corrupt and refused writes never raise."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import pytest

from gpu_exporter.forward.spool import Spool
from tests.support import child_env


class Drops:
    def __init__(self) -> None:
        self.batches: dict[str, int] = {}
        self.samples: dict[str, int] = {}

    def __call__(self, reason: str, batches: int, samples: int) -> None:
        self.batches[reason] = self.batches.get(reason, 0) + batches
        self.samples[reason] = self.samples.get(reason, 0) + samples


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_past_the_byte_cap_the_oldest_batches_go_first_and_are_counted(tmp_path: Path) -> None:
    drops = Drops()
    spool = Spool(str(tmp_path), max_bytes=10_000, max_age=1e9, on_drop=drops)
    spool.open()
    for i in range(15):
        spool.put(bytes([i]) * 1000, first_seq=i * 10 + 1, last_seq=i * 10 + 10, samples=10)
    assert spool.total_bytes == 10_000
    assert [e.first_seq for e in spool.entries()] == [i * 10 + 1 for i in range(5, 15)]
    assert drops.batches == {"max_bytes": 5} and drops.samples == {"max_bytes": 50}
    oldest = spool.oldest()
    assert oldest is not None and spool.get(oldest) == bytes([5]) * 1000


def test_a_batch_in_flight_is_never_dropped_by_the_caps(tmp_path: Path) -> None:
    # The broker may be acknowledging it: dropped too, it would count as lost and as delivered.
    drops, clock = Drops(), Clock()
    spool = Spool(str(tmp_path), max_bytes=5_000, max_age=3600, on_drop=drops, clock=clock)
    spool.open()
    first = spool.put(b"a" * 1000, 1, 10, 10)
    spool.pinned.add(first.key)  # published, PUBACK pending
    for i in range(1, 6):
        spool.put(bytes([i]) * 1000, i * 10 + 1, i * 10 + 10, 10)
    assert first in spool and spool.get(first) == b"a" * 1000
    assert [e.first_seq for e in spool.entries()] == [1, 21, 31, 41, 51]  # the next oldest went instead
    assert drops.batches == {"max_bytes": 1}
    clock.now += 7200
    spool.expire()
    assert [e.first_seq for e in spool.entries()] == [1]  # the age limit passes over it too
    spool.pinned.discard(first.key)  # the connection dropped: it is an ordinary old batch again
    spool.expire()
    assert len(spool) == 0 and drops.batches == {"max_bytes": 1, "max_age": 5}
    spool.close()


def test_a_batch_larger_than_the_whole_cap_is_dropped_and_counted(tmp_path: Path) -> None:
    drops = Drops()
    spool = Spool(str(tmp_path), max_bytes=1000, max_age=1e9, on_drop=drops)
    spool.open()
    entry = spool.put(b"x" * 5000, 1, 3, 3)
    assert entry not in spool and len(spool) == 0 and spool.total_bytes == 0
    assert drops.samples == {"max_bytes": 3}


def test_batches_older_than_max_age_expire(tmp_path: Path) -> None:
    drops, clock = Drops(), Clock()
    spool = Spool(str(tmp_path), max_bytes=1 << 20, max_age=3600, on_drop=drops, clock=clock)
    spool.open()
    spool.put(b"old", 1, 1, 1)
    clock.now += 1800
    spool.put(b"newer", 2, 2, 1)
    assert spool.oldest_age() == 1800
    clock.now += 1801
    assert spool.expire() == 1
    assert [e.first_seq for e in spool.entries()] == [2]
    assert drops.batches == {"max_age": 1}


def test_reopening_restores_order_sizes_and_the_journal(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 20, 1e9)
    spool.open()
    for i in range(1, 13):  # more than 9, so a lexical order of unpadded counters would differ
        spool.put(f"batch {i}".encode(), i, i, 1)
    first = spool.oldest()
    assert first is not None
    spool.remove(first)
    spool.journal("b00t", 13, b"open sample 13")
    spool.close()

    again = Spool(str(tmp_path), 1 << 20, 1e9)
    journal = again.open()
    assert journal == [("j.b00t.000000000013", b"open sample 13")]
    assert [e.first_seq for e in again.entries()] == list(range(2, 13))
    assert again.total_bytes == sum(len(f"batch {i}") for i in range(2, 13))
    newest = again.put(b"after restart", 14, 14, 1)
    assert again.newest() == newest and newest.counter == 13


def test_a_long_queue_keeps_its_order_through_removals_anywhere(tmp_path: Path) -> None:
    """Acknowledgements come newest first (fresh batches) and oldest first (the backlog), drops happen
    while iterating: the spool answers as a plain ordered list of what is left would, also after a restart."""
    spool = Spool(str(tmp_path), 1 << 30, 1e9)
    spool.open()
    entries = [spool.put(f"b{i}".encode(), i, i, 1) for i in range(1, 1201)]
    left = list(entries)
    for entry in entries[1100:][::-1] + entries[:700] + entries[900:1000:3]:  # newest, oldest, a middle stretch
        assert spool.remove(entry) and not spool.remove(entry)
        left.remove(entry)
    assert entries[0] not in spool and entries[800] in spool
    for entry in spool.entries():  # dropping every other one while iterating skips nothing else
        if entry.first_seq % 2:
            assert spool.remove(entry)
            left.remove(entry)
    assert list(spool.entries()) == left and len(spool) == len(left)
    assert spool.oldest() == left[0] and spool.newest() == left[-1]
    assert spool.total_bytes == sum(e.size for e in left)
    assert all(spool.get(e) == f"b{e.first_seq}".encode() for e in left)
    spool.close()

    again = Spool(str(tmp_path), 1 << 30, 1e9)
    again.open()
    assert list(again.entries()) == left
    assert again.put(b"next", 1201, 1201, 1).counter == left[-1].counter + 1
    for entry in list(again.entries()):
        again.remove(entry)
    assert len(again) == 0 and again.oldest() is None and again.newest() is None


def test_foreign_keys_and_an_unreadable_database_are_moved_aside(tmp_path: Path) -> None:
    import diskcache

    with diskcache.Cache(str(tmp_path)) as cache:
        cache.set("q.not-a-batch", b"junk")
    drops = Drops()
    spool = Spool(str(tmp_path), 1 << 20, 1e9, on_drop=drops)
    spool.open()
    assert len(spool) == 0 and drops.batches == {"corrupt": 1}
    assert (tmp_path / "corrupt" / "q.not-a-batch.bin").read_bytes() == b"junk"
    spool.close()

    db = tmp_path / "cache.db"
    db.write_bytes(b"this is not an sqlite database" * 100)
    for extra in ("cache.db-wal", "cache.db-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    spool = Spool(str(tmp_path), 1 << 20, 1e9, on_drop=drops)
    spool.open()
    entry = spool.put(b"fresh", 1, 1, 1)
    assert spool.get(entry) == b"fresh" and spool.write_errors == 0
    assert any(p.name.startswith("db-") for p in (tmp_path / "corrupt").iterdir())


def test_a_value_file_that_vanished_is_counted_as_corrupt(tmp_path: Path) -> None:
    drops = Drops()
    spool = Spool(str(tmp_path), 1 << 30, 1e9, on_drop=drops)
    spool.open()
    entry = spool.put(b"z" * 100_000, 1, 5, 5)  # large values live in their own file
    for f in tmp_path.rglob("*.val"):
        f.unlink()
    assert spool.get(entry) is None
    assert entry not in spool and drops.samples == {"corrupt": 5}


def test_a_full_disk_is_counted_and_never_raises(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes every write past 2 MiB fail (EFBIG), as a full disk would (ENOSPC)."""
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from gpu_exporter.forward.spool import Spool
        from gpu_exporter.forward.spool_faults import MEMORY_CAP
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        drops = {{}}
        def on_drop(reason, batches, samples):
            drops[reason] = drops.get(reason, 0) + batches
        spool = Spool({str(tmp_path)!r}, 1 << 40, 1e9, on_drop=on_drop)
        spool.open()
        resource.setrlimit(resource.RLIMIT_FSIZE, (2 * 1024 * 1024, 2 * 1024 * 1024))
        blob = bytes(range(256)) * 120  # 30 KiB, kept inside SQLite's database: it passes 2 MiB
        entries = [spool.put(blob, i, i, 1) for i in range(1, 601)]  # 18 MiB
        assert spool.write_errors > 0, "the disk should have refused"
        kept = [e for e in entries if e in spool]
        assert all(spool.get(e) == blob for e in kept)
        assert drops.get("disk_full", 0) > 0
        assert len(kept) + drops["disk_full"] == 600
        print("ok", spool.write_errors, len(kept), drops["disk_full"])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env=child_env(), capture_output=True, timeout=120, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    assert result.stdout.startswith(b"ok"), result.stdout
    assert b"Traceback" not in result.stderr
    assert result.stderr.decode().count("failed") == 1, result.stderr.decode()  # one clear line, not one per batch


class Usage(NamedTuple):
    total: int
    used: int
    free: int


def test_the_spool_leaves_a_reserve_free_on_its_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A 4 MiB volume (its free space faked from what the spool holds): the spool keeps 1 MiB of it free,
    dropping its oldest batches as disk_full, as few as needed and never the batch being written, also
    when something else takes the space; one log line for it, not one per batch."""
    total, other = 4 << 20, [0]
    drops = Drops()
    spool = Spool(str(tmp_path), max_bytes=1 << 30, max_age=1e9, on_drop=drops)

    def disk_usage(path: str) -> Usage:
        used = other[0] + spool.total_bytes
        return Usage(total, used, max(0, total - used))

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    spool.open()
    entries = [spool.put(bytes([i]) * 100 * 1024, i, i, 2) for i in range(1, 41)]
    assert spool.write_errors == 0
    assert list(spool.entries()) == entries[10:]  # 30 x 100 KiB fit in 3 MiB: the 10 oldest went
    assert drops.batches == {"disk_full": 10} and drops.samples == {"disk_full": 20}
    assert len([r for r in caplog.records if "nearly full" in r.getMessage()]) == 1

    other[0] = 1 << 20  # something else takes 1 MiB: 72 KiB free, the next expire() gives 952 KiB back
    spool.expire()
    assert list(spool.entries()) == entries[20:] and drops.batches == {"disk_full": 20}
    spool.expire()
    assert drops.batches == {"disk_full": 20}  # no more than needed

    other[0] = 2 * total  # nothing to be had: every batch on disk goes, the one being written stays
    last = spool.put(bytes(5 << 20), 41, 41, 1)
    assert list(spool.entries()) == [last] and drops.batches == {"disk_full": 40}
    assert spool.get(last) == bytes(5 << 20)
    spool.close()
