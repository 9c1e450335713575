"""A spool whose directory someone else wrote: rows in any form but raw bytes are never interpreted, but
moved aside and counted; a damaged write-ahead log is counted with what it cost.

The rows are planted with sqlite3 directly, as whoever can write the hostPath would. Each pickle's
``__reduce__`` would create a file when unpickled (diskcache's ``Disk.fetch`` and ``Disk.get`` unpickle
mode-4 values and not-raw keys): the file must never appear.
"""

from __future__ import annotations

import pickle
import random
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import diskcache
import pytest

from gpu_exporter.forward.spool import Spool
from gpu_exporter.forward.spool_disk import check_wal
from gpu_exporter.payload import Batch, encode
from tests.integration.test_forward_service import make_sample
from tests.support import child_env
from tests.support.agent_proc import FAST, Proc
from tests.support.mosquitto import Broker, Collector, broker_fixture, wait_until  # noqa: F401  (the broker fixture)
from tests.unit.forward.test_forward_spool import Drops


class _Plant:
    """A pickle that creates ``path`` when loaded (``open(path, "w")``)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _spool_with_batches(directory: Path, n: int = 2) -> list[bytes]:
    spool = Spool(str(directory), 1 << 30, 1e9)
    spool.open()
    batches = [f"batch {i}".encode() * 10 for i in range(1, n + 1)]
    for i, data in enumerate(batches, 1):
        spool.put(data, i, i, 1)
    spool.close()
    return batches


def _plant(directory: Path, key: bytes | str, raw: int, mode: int, value: Any, filename: str | None) -> None:
    with sqlite3.connect(directory / "cache.db") as db:
        db.execute(
            "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, size, mode,"
            " filename, value) VALUES (?, ?, 0, NULL, 0, 0, NULL, ?, ?, ?, ?)",
            (key, raw, len(value) if isinstance(value, bytes) else 0, mode, filename, value),
        )


def _read_all(spool: Spool) -> list[bytes | None]:
    return [spool.get(entry) for entry in list(spool.entries())]


def test_a_planted_pickle_value_never_runs_and_is_moved_aside_and_counted(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    batches = _spool_with_batches(tmp_path / "spool")
    payload = pickle.dumps(_Plant(marker))
    _plant(tmp_path / "spool", "q.000000000099.1700000000000.100.9.9.4", 1, 4, payload, None)
    drops = Drops()
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9, on_drop=drops)
    spool.open()
    assert _read_all(spool) == [*batches, None]  # the forwarder's read of each batch
    assert not marker.exists()
    assert spool.rejected == {"pickle": 1} and drops.batches == {"corrupt": 1} and drops.samples == {"corrupt": 4}
    kept = tmp_path / "spool" / "corrupt" / "q.000000000099.1700000000000.100.9.9.4.bin"
    assert kept.read_bytes() == payload  # kept as it was, for whoever investigates
    spool.close()
    again = Spool(str(tmp_path / "spool"), 1 << 30, 1e9)
    again.open()
    assert _read_all(again) == batches and not marker.exists()  # gone from the database


def test_stock_diskcache_would_have_run_it(tmp_path: Path) -> None:
    """The attack is real: the same row read through diskcache's own Disk runs the pickle."""
    marker = tmp_path / "pwned"
    _spool_with_batches(tmp_path / "spool")
    _plant(tmp_path / "spool", "q.x", 1, 4, pickle.dumps(_Plant(marker)), None)
    with diskcache.Cache(str(tmp_path / "spool")) as cache:
        cache.get("q.x")
    assert marker.exists()


def test_a_planted_pickled_key_and_pickled_journal_entry_never_run(tmp_path: Path) -> None:
    marker_key, marker_journal = tmp_path / "pwned-by-key", tmp_path / "pwned-by-journal"
    batches = _spool_with_batches(tmp_path / "spool")
    _plant(tmp_path / "spool", pickle.dumps(_Plant(marker_key)), 0, 1, b"value", None)
    _plant(tmp_path / "spool", "j.b00t.000000000007", 1, 4, pickle.dumps(_Plant(marker_journal)), None)
    drops = Drops()
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9, on_drop=drops)
    assert spool.open() == []  # no journal entry recovered from it
    assert _read_all(spool) == batches
    assert not marker_key.exists() and not marker_journal.exists()
    assert spool.rejected == {"key": 1, "pickle": 1}
    assert drops.batches == {"corrupt": 1} and drops.samples == {"corrupt": 1}
    spool.close()
    with sqlite3.connect(tmp_path / "spool" / "cache.db") as db:  # both rows left the database
        assert db.execute("SELECT count(*) FROM Cache WHERE raw = 0 OR mode = 4").fetchone() == (0,)


@pytest.mark.parametrize("key", [b"q.raw-bytes-key", 12345, 1.5])
def test_a_raw_key_that_is_not_text_is_moved_aside_and_counted_and_the_rest_still_opens(
    tmp_path: Path, key: Any
) -> None:
    batches = _spool_with_batches(tmp_path / "spool")
    _plant(tmp_path / "spool", key, 1, 1, b"value", None)
    _plant(tmp_path / "spool", "j.b00t.000000000007", 1, 1, b"journaled sample", None)
    drops = Drops()
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9, on_drop=drops)
    assert spool.open() == [("j.b00t.000000000007", b"journaled sample")]  # the rest of the spool opened
    assert _read_all(spool) == batches
    assert spool.rejected == {"key": 1} and drops.batches == {"corrupt": 1}
    spool.close()
    with sqlite3.connect(tmp_path / "spool" / "cache.db") as db:
        assert db.execute("SELECT count(*) FROM Cache WHERE typeof(key) != 'text'").fetchone() == (0,)


@pytest.mark.parametrize(
    ("mode", "value", "filename", "reason"),
    [
        (3, None, "ab/cd/0123456789abcdef0123456789ab.val", "text"),
        (1, 12345, None, "not_bytes"),
        (9, b"x", None, "mode"),
        (2, None, "../outside", "file"),  # the file below, beside the spool directory
    ],
)
def test_a_row_in_any_other_form_is_moved_aside_and_counted_by_reason(
    tmp_path: Path, mode: int, value: Any, filename: str | None, reason: str
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"a file the spool must neither send nor delete")
    (tmp_path / "spool" / "ab" / "cd").mkdir(parents=True)
    (tmp_path / "spool" / "ab" / "cd" / "0123456789abcdef0123456789ab.val").write_text("text value")
    batches = _spool_with_batches(tmp_path / "spool")
    _plant(tmp_path / "spool", "q.000000000099.1700000000000.10.9.9.1", 1, mode, value, filename)
    drops = Drops()
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9, on_drop=drops)
    spool.open()
    assert _read_all(spool) == [*batches, None]
    assert spool.rejected == {reason: 1} and drops.batches == {"corrupt": 1}
    assert outside.read_bytes() == b"a file the spool must neither send nor delete"


def test_the_spool_refuses_to_store_anything_but_bytes(tmp_path: Path) -> None:
    spool = Spool(str(tmp_path), 1 << 30, 1e9)
    spool.open()
    assert spool._cache is not None
    with pytest.raises(TypeError):
        spool._cache.set("q.x", {"a": 1})  # would have been pickled
    with pytest.raises(TypeError):
        spool._cache.set(("tuple", "key"), b"x")


# --- the write-ahead log ---


def _killed_with_a_wal(directory: Path, batches: int = 20) -> Path:
    """A spool process killed (SIGKILL) after ``batches`` puts: its WAL holds them, not yet checkpointed."""
    code = textwrap.dedent(
        f"""
        import os
        from gpu_exporter.forward.spool import Spool
        spool = Spool({str(directory)!r}, 1 << 30, 1e9)
        spool.open()
        for i in range(1, {batches} + 1):
            spool.put(b"x" * 500, i, i, 10)
        os.kill(os.getpid(), 9)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), timeout=60, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()[-2000:]
    wal = directory / "cache.db-wal"
    assert wal.stat().st_size > 32
    return wal


def test_a_sound_wal_after_a_kill_loses_nothing_and_counts_nothing(tmp_path: Path) -> None:
    wal = _killed_with_a_wal(tmp_path / "spool")
    assert check_wal(str(wal)) is None
    drops = Drops()
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9, on_drop=drops)
    spool.open()
    assert len(spool) == 20 and spool.rejected == {} and spool.wal_damaged == 0 and drops.batches == {}


@pytest.mark.parametrize("where", ["header", "frames"])
def test_a_garbage_wal_is_counted_with_its_size_and_kept_aside(tmp_path: Path, where: str) -> None:
    wal = _killed_with_a_wal(tmp_path / "spool")
    size = wal.stat().st_size
    start = 0 if where == "header" else 32 + 3 * (24 + 4096)
    # fixed garbage: one random frame in 4,096 carries a salt that reads as an earlier generation of the WAL
    # (frames SQLite ignores, spool_disk.check_wal), which is no damage
    garbage = random.Random(20).randbytes(size - start)
    with open(wal, "r+b") as handle:
        handle.seek(start)
        handle.write(garbage)
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9)
    spool.open()
    assert len(spool) < 20  # what SQLite dropped
    assert spool.wal_damaged == 1 and spool.rejected == {"wal": 1}
    assert spool.wal_lost_bytes == size - (32 if where == "header" else start)
    kept = [p for p in (tmp_path / "spool" / "corrupt").iterdir() if p.name.startswith("wal-")]
    assert len(kept) == 1 and kept[0].stat().st_size == size
    spool.close()
    again = Spool(str(tmp_path / "spool"), 1 << 30, 1e9)
    again.open()
    assert again.wal_damaged == 0  # counted once: SQLite started a sound WAL over it


def test_a_wal_damaged_in_its_last_frame_only_is_counted(tmp_path: Path) -> None:
    """The last frame holds the last commit: a bit flipped there (a torn write on power loss) makes SQLite
    drop that commit, so it is counted like damage anywhere else."""
    wal = _killed_with_a_wal(tmp_path / "spool")
    size = wal.stat().st_size
    frame = 24 + 4096
    assert (size - 32) % frame == 0
    with open(wal, "r+b") as handle:
        handle.seek(size - 100)  # inside the last frame's page
        byte = handle.read(1)[0]
        handle.seek(size - 100)
        handle.write(bytes([byte ^ 0xFF]))
    damage = check_wal(str(wal))
    assert damage is not None and damage.offset == size - frame
    spool = Spool(str(tmp_path / "spool"), 1 << 30, 1e9)
    spool.open()
    assert spool.wal_damaged == 1 and spool.rejected == {"wal": 1} and spool.wal_lost_bytes == frame
    spool.close()


def test_frames_left_over_from_before_a_wal_restart_are_no_damage(tmp_path: Path) -> None:
    """After a checkpoint SQLite writes the WAL again from its start with new salts: the older frames
    behind the new ones are what every busy spool has, not a loss."""
    directory = tmp_path / "spool"
    code = textwrap.dedent(
        f"""
        import os
        from gpu_exporter.forward.spool import Spool
        spool = Spool({str(directory)!r}, 1 << 30, 1e9)
        spool.open()
        for i in range(1, 400):  # several checkpoints (every 128 pages) and WAL restarts
            spool.put(bytes([i % 256]) * 3000, i, i, 1)
        os.kill(os.getpid(), 9)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], env=child_env(), timeout=120, capture_output=True)
    assert result.returncode == -9, result.stderr.decode()[-2000:]
    assert check_wal(str(directory / "cache.db-wal")) is None
    spool = Spool(str(directory), 1 << 30, 1e9)
    spool.open()
    assert len(spool) == 399 and spool.wal_damaged == 0


def test_the_agent_sends_its_spool_over_a_real_broker_without_running_a_planted_pickle(
    tmp_path: Path, broker: Broker
) -> None:
    """The attack on the real agent: a pickle row planted in its spool (the hostPath) before it starts.
    The agent sends the sound batches, never runs the pickle, and says so in its metrics."""
    marker = tmp_path / "pwned"
    spool_dir = tmp_path / "spool"
    old = Spool(str(spool_dir), 1 << 30, 1e9)
    old.open()
    for seq in (1, 2, 3):
        old.put(encode(Batch("edge-1", "0ldb00t", (make_sample(seq),))), seq, seq, 1)
    old.close()
    _plant(spool_dir, "q.000000000099.1700000000000.100.9.9.4", 1, 4, pickle.dumps(_Plant(marker)), None)
    with Collector(broker) as collector:
        proc = Proc(tmp_path, *FAST, f"--mqtt.url={broker.url}", f"--spool.dir={spool_dir}").start()
        try:
            rejected = 'gpu_exporter_forward_spool_rejected_total{reason="pickle"}'
            assert wait_until(lambda: proc.metric(rejected) == 1, 30), proc.log()[-3000:]
            assert wait_until(lambda: collector.seqs().get("0ldb00t") == {1, 2, 3}, 30), proc.log()[-3000:]
            # the row is refused (counted) before it is moved aside and its loss counted, and the page is
            # rendered once per sample: under load it can show the refusal before the loss (bounded wait)
            batches = 'gpu_exporter_forward_dropped_batches_total{reason="corrupt"}'
            samples = 'gpu_exporter_forward_dropped_samples_total{reason="corrupt"}'
            assert wait_until(lambda: proc.metric(batches) >= 1, 30), proc.log()[-3000:]
            metrics = proc.metrics()
            assert metrics[batches] == 1
            assert metrics[samples] == 4
        finally:
            assert proc.stop() == 0
    assert not marker.exists()
    assert "moved aside" in proc.log() and "Traceback" not in proc.log()
