"""What the spool does when its disk refuses, fills up or turns out damaged (mixed into ``spool.Spool``).

A refused write keeps the batch in memory (up to ``MEMORY_CAP``) and is counted; ``_catch_up`` writes
it once the disk takes writes again and repeats the deletes the disk refused. ``_keep_reserve`` drops
the oldest batches so that the spool never takes the last free space of its filesystem. A corrupt
database, a damaged write-ahead log and rows in another form than raw bytes are moved aside under
``<dir>/corrupt/`` and counted, never raised and never interpreted. See spool.py's module doc.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import diskcache

from gpu_exporter.forward.spool_disk import ForeignKey, Refused, SafeDisk, check_wal
from gpu_exporter.forward.spool_index import Entry, Index

__all__ = ["DISK_ERRORS", "LOG_EVERY", "MEMORY_CAP", "SETTINGS", "DiskFaults", "Held", "is_corrupt"]

log = logging.getLogger("gpu_exporter.forward.spool")

MEMORY_CAP = 8 * 1024 * 1024  # bytes kept in memory while the disk refuses writes
_CORRUPT_KEEP = 20  # quarantined files kept for inspection
_CATCH_UP_BYTES = 1024 * 1024  # memory-held batches written to disk per catch-up (close writes them all)
LOG_EVERY = 60.0  # seconds between two log lines about a disk that keeps refusing writes
DISK_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)
# Free space the spool leaves on its filesystem: 1 % of it, within [1 MiB, 32 MiB]. SQLite needs room to
# delete rows and to checkpoint: the WAL grows by up to _WAL_PAGES pages (512 KiB) plus one transaction,
# then a checkpoint copies it into the database file, which may grow by as much. 1 MiB covers that, 32 MiB
# is plenty on any disk, and 1 % in between leaves mid-sized volumes (0.1 to 3 GiB) room for other tenants.
_RESERVE_SHARE = 100
_RESERVE_MIN = 1024 * 1024
_RESERVE_MAX = 32 * 1024 * 1024
_WAL_PAGES = 128
SETTINGS: dict[str, Any] = {
    "eviction_policy": "none",  # the caps are enforced here, counted, oldest first
    "size_limit": 2**62,
    "cull_limit": 0,
    "statistics": 0,
    "tag_index": 0,
    "sqlite_cache_size": 32,  # pages: 128 KiB of SQLite cache instead of 32 MiB; the access is append-and-delete
    "sqlite_mmap_size": 0,  # no mmap: keeps RSS small while a full spool drains
    "sqlite_synchronous": 1,  # NORMAL with WAL: survives a killed process
    "sqlite_auto_vacuum": 1,  # FULL (diskcache's default too): a deleted row's pages go back to the filesystem
    "sqlite_wal_autocheckpoint": _WAL_PAGES,  # pages: a WAL of 512 KiB at most, not SQLite's 1000 pages
    "sqlite_journal_size_limit": 1024 * 1024,  # bytes: a WAL a large transaction grew is cut back to this
}

_Disk = SafeDisk  # the name tests and tools opened the spool's cache with


@dataclass(frozen=True, slots=True)
class Held:
    """A batch the disk refused, and the journal keys its samples still have on disk."""

    data: bytes
    journal: tuple[str, ...]


def is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """A damaged or foreign database file, as opposed to a full, read-only, locked or failing disk."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return type(exc) is sqlite3.DatabaseError
    return (code & 0xFF) in (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (named in the sqlite3 module from 3.11)


class DiskFaults:
    """Mixed into ``Spool``, whose constructor sets what is declared here (one thread uses it all)."""

    directory: str
    pinned: set[str]
    rejected: dict[str, int]
    wal_damaged: int
    wal_lost_bytes: int
    write_errors: int
    disk_error: str
    _cache: diskcache.Cache | None
    _index: Index
    _bytes: int
    _memory: dict[str, Held]
    _memory_bytes: int
    _unreleased: dict[str, None]
    _refusing: bool
    _logged_at: float
    _reserve_drops: int
    _reserve_logged_at: float
    _on_drop: Callable[[str, int, int], None]

    if TYPE_CHECKING:  # the queue, in spool.py

        def _write(self, key: str, data: bytes, journal: Sequence[str]) -> BaseException | None: ...

        def entries(self) -> Iterator[Entry]: ...

    def _catch_up(self, limit: int | None = _CATCH_UP_BYTES) -> None:
        """Retry the deletes the disk refused, then write memory-held batches to disk, oldest first.

        A retry the disk refuses again is not counted: the write or delete it repeats was counted once.
        """
        if self._cache is None or not (self._unreleased or self._memory):
            return
        for key in list(self._unreleased):
            try:
                self._cache.delete(key)  # its own transaction: a value file goes only after the commit
            except DISK_ERRORS:
                return
            del self._unreleased[key]
        written = 0
        for key, held in list(self._memory.items()):
            if limit is not None and written >= limit:
                return
            self._keep_reserve(len(held.data))
            if self._write(key, held.data, held.journal) is not None:
                return
            self._disk_ok()
            del self._memory[key]
            self._memory_bytes -= len(held.data)
            written += len(held.data)

    def _keep_reserve(self, incoming: int = 0) -> None:
        """Drop the oldest batches on disk until writing ``incoming`` more bytes leaves the reserve free.

        As few as that takes: a dropped batch gives back about its size (its value file at once, its pages
        at the checkpoint below, auto_vacuum truncating the database file). Batches held in memory free
        nothing on disk and stay. A delete the disk refuses ends it and keeps that batch, uncounted: the
        write that follows, refused too then, is counted.
        """
        if self._cache is None or len(self._index) == 0:
            return
        try:
            usage = shutil.disk_usage(self.directory)
        except OSError:
            return
        if usage.total <= 0:
            return  # a filesystem that does not tell its size
        reserve = min(max(usage.total // _RESERVE_SHARE, _RESERVE_MIN), _RESERVE_MAX)
        short = reserve + incoming - usage.free
        if short <= 0:
            return
        freed = batches = samples = 0
        for entry in self.entries():
            if freed >= short:
                break
            if entry.key in self._memory or entry.key in self.pinned:
                continue
            try:
                self._cache.delete(entry.key)
            except DISK_ERRORS:
                break
            self._index.remove(entry)
            self._bytes -= entry.size
            freed += entry.size
            batches += 1
            samples += entry.samples
        if not batches:
            return
        # Give the pages back now, before the next check reads them, on this thread's diskcache connection
        # (diskcache's own attribute: should a release lack it, the space comes back at the next checkpoint).
        with contextlib.suppress(*DISK_ERRORS, AttributeError):
            self._cache._sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        self._reserve_drops += batches
        now = time.monotonic()
        if now - self._reserve_logged_at >= LOG_EVERY:
            self._reserve_logged_at = now
            log.warning(
                "spool: the filesystem of %s is nearly full (%d KiB free, %d KiB kept free for the spool's "
                "database); dropping the oldest batches (disk_full, %d so far)",
                self.directory,
                usage.free // 1024,
                reserve // 1024,
                self._reserve_drops,
            )
        self._on_drop("disk_full", batches, samples)

    def _read(self, key: str) -> bytes | Refused | None:
        """The stored bytes; a ``Refused`` for a row in another form (never interpreted); None when the
        row is missing or cannot be read."""
        if self._cache is None:
            return None
        try:
            value = self._cache.get(key)
        except (*DISK_ERRORS, ValueError, TypeError) as exc:
            log.warning("spool: cannot read %s: %s", key, exc)
            return None
        return value if isinstance(value, (bytes, Refused)) else None

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def _check_wal(self) -> None:
        """Before SQLite opens the database: a damaged WAL is kept aside, said and counted (SQLite would
        drop it, or its frames from the damage on, without a word)."""
        wal = os.path.join(self.directory, "cache.db-wal")
        damage = check_wal(wal)
        if damage is None:
            return
        aside = os.path.join(self.directory, "corrupt", f"wal-{int(time.time() * 1000)}.bin")
        try:
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            shutil.copyfile(wal, aside)
        except OSError as exc:
            aside = f"nowhere ({exc.strerror or exc})"
        self.wal_damaged += 1
        self.wal_lost_bytes += damage.lost
        self._reject("wal")
        log.error(
            "spool: the write-ahead log %s is damaged (%s): SQLite drops its last %d of %d bytes and the "
            "batches committed in them, which cannot be read from it to be counted; a copy is kept at %s",
            wal,
            damage.why,
            damage.lost,
            damage.size,
            aside,
        )

    def _delete(self, key: str) -> None:
        if self._cache is None:
            return
        try:
            self._cache.delete(key)
        except DISK_ERRORS as exc:
            self._unreleased[key] = None  # retried once the disk takes writes again
            self._disk_failed("delete", exc)

    def _quarantine_key(self, key: Any, why: str, data: bytes | Refused | None = None) -> None:
        if data is None and isinstance(key, str):
            data = self._read(key)
        if isinstance(data, Refused):
            self._reject(data.reason)
            why = f"{why} (stored as {data.reason}; never read)"
            data = data.data
        self._delete(key)
        if data is not None:
            self._save_aside(str(key) if isinstance(key, str) else "key-" + key.blob.hex()[:32], data)
        log.warning("spool entry %s: %s; moved aside", key if isinstance(key, ForeignKey) else repr(key), why)

    def _save_aside(self, name: str, data: bytes) -> None:
        folder = os.path.join(self.directory, "corrupt")
        try:
            os.makedirs(folder, exist_ok=True)
            safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:120]
            with open(os.path.join(folder, safe + ".bin"), "wb") as handle:
                handle.write(data)
            kept = sorted(os.scandir(folder), key=lambda e: e.stat().st_mtime)
            for old in [e for e in kept if e.is_file()][:-_CORRUPT_KEEP]:
                os.unlink(old.path)
        except OSError as exc:
            log.warning("spool: cannot keep corrupt entry %s aside: %s", name, exc)

    def _corrupt_now(self, exc: sqlite3.DatabaseError) -> None:
        """The database turned out corrupt while running: move it aside, count what it held, start afresh."""
        assert self._cache is not None
        with contextlib.suppress(Exception):
            self._cache.close()
        self._cache = None
        aside = os.path.join(self.directory, "corrupt", f"db-{int(time.time() * 1000)}")
        try:
            os.makedirs(aside, exist_ok=True)
            for name in os.listdir(self.directory):
                if name.startswith("cache.db"):
                    os.replace(os.path.join(self.directory, name), os.path.join(aside, name))
            self._cache = diskcache.Cache(self.directory, disk=SafeDisk, **SETTINGS)
        except DISK_ERRORS as again:
            log.error("spool: cannot replace the corrupt database in %s: %s", self.directory, again)
            self._cache = None
        lost = [e for e in self.entries() if e.key not in self._memory and e.key not in self.pinned]
        for entry in lost:
            self._index.remove(entry)
            self._bytes -= entry.size
        self._unreleased.clear()
        log.error(
            "spool database in %s is corrupt (%s); moved to %s, %d batches on it lost, starting a new one",
            self.directory,
            exc,
            aside,
            len(lost),
        )
        self._on_drop("corrupt", len(lost), sum(e.samples for e in lost))

    def _disk_failed(self, op: str, exc: BaseException) -> None:
        """Count a refused write; one log line when the disk starts refusing, then one a minute at most.

        A corrupt database is no refusing disk: it is moved aside (``_corrupt_now``), not counted here.
        """
        if isinstance(exc, sqlite3.DatabaseError) and is_corrupt(exc) and self._cache is not None:
            self._corrupt_now(exc)
            return
        self.write_errors += 1
        self.disk_error = f"{op}: {exc}"
        now = time.monotonic()
        if not self._refusing or now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            log.error(
                "spool %s in %s failed: %s (batches are kept in memory, up to %d MiB; %d refused writes so far)",
                op,
                self.directory,
                exc,
                MEMORY_CAP // (1024 * 1024),
                self.write_errors,
            )
        self._refusing = True

    def _disk_ok(self) -> None:
        if self._refusing:
            self._refusing = False
            log.warning("spool in %s takes writes again after %d refused", self.directory, self.write_errors)
