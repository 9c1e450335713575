"""The on-disk spool: a write-ahead log of batches waiting for the broker's acknowledgement.

A batch is stored here before it is published and removed only when the broker acknowledged it
(PUBACK), so a broker outage, a network outage or a killed agent loses nothing that reached the spool.
Samples of the batch still being assembled are journaled one by one (``j.`` keys) and folded into
batches when the agent starts again, so even the open batch survives a SIGKILL.

Storage is a diskcache ``Cache`` (SQLite in WAL mode, large values in files), with its own eviction
off: the caps are ours. Queue keys are ``q.<counter>.<created_ms>.<bytes>.<first_seq>.<last_seq>.<n>``
with a zero-padded counter, so the oldest is the first key in sort order and the index can be rebuilt
from the keys alone, without reading a single value.

Caps: past ``max_bytes`` (payload bytes) or ``max_age`` the oldest batches are dropped and reported
through ``on_drop(reason, batches, samples)``. A corrupt entry is moved to ``<dir>/corrupt/`` and
reported, never raised. When the disk refuses a write (ENOSPC, EIO, an unreadable database) the batch is
kept in memory instead, within a small bound, and ``write_errors`` counts the failures; batches past the
bound are dropped as ``disk_full``. Once the disk takes writes again, the batches held in memory are
written to it and the deletes it refused meanwhile (acknowledged or dropped batches) are done, so a
restart neither loses the former nor sends the latter again. What is still held in memory at ``close``
is counted as ``disk_full`` too. A full disk is not a corrupt database: it is never moved aside.

A spool that could not be opened at start (a directory not yet mounted or writable) is retried by
``retry_open``: once it opens, the batches held in memory go to disk. A database found corrupt while
running (SQLite says so on a write) is moved aside like one found at start, its batches on disk are
counted as ``corrupt``, and a fresh database takes over.

The spool never takes the last free space of its filesystem: SQLite needs some to delete a row (the WAL
grows) and to checkpoint (the database file grows), so a spool that filled its disk could neither store
nor forget a batch until restarted. Before each write, and each time ``expire`` runs, it reads the free
space (``statvfs``); when the write would leave less than a reserve free (1 % of the filesystem, at least
1 MiB, at most 32 MiB), the oldest batches on disk are dropped, as few as leave the reserve free (never
the batch being written), and reported as ``disk_full``, with one log line a minute at most. This also
happens when something else fills the filesystem: the spool then gives up its oldest batches so that it
can still write and delete. The WAL is checkpointed every 128 pages and cut back to 1 MiB, so it never
holds much of the disk either.

Only raw bytes are read back (``spool_disk.SafeDisk``): a row stored in any other form (a pickle, which
diskcache would have unpickled, text, a number, a file outside the spool) is moved aside and counted in
``rejected`` by reason, never interpreted. A damaged write-ahead log, which SQLite drops silently with
the batches committed in it, is kept aside and counted with its size (``wal_damaged``,
``wal_lost_bytes``). Ages are measured in spool time (``spool_clock.SpoolClock``), which a wall-clock
step does not move.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import diskcache

from gpu_exporter.forward.spool_clock import STATE_KEY, SpoolClock, boottime
from gpu_exporter.forward.spool_disk import ForeignKey, Refused, SafeDisk, check_wal

__all__ = ["Entry", "Spool"]

log = logging.getLogger(__name__)

_MEMORY_CAP = 8 * 1024 * 1024  # bytes kept in memory while the disk refuses writes
_CORRUPT_KEEP = 20  # quarantined files kept for inspection
_CATCH_UP_BYTES = 1024 * 1024  # memory-held batches written to disk per catch-up (close writes them all)
_LOG_EVERY = 60.0  # seconds between two log lines about a disk that keeps refusing writes
_DISK_ERRORS = (OSError, sqlite3.Error, diskcache.Timeout)
# Free space the spool leaves on its filesystem: 1 % of it, within [1 MiB, 32 MiB]. SQLite needs room to
# delete rows and to checkpoint: the WAL grows by up to _WAL_PAGES pages (512 KiB) plus one transaction,
# then a checkpoint copies it into the database file, which may grow by as much. 1 MiB covers that, 32 MiB
# is plenty on any disk, and 1 % in between leaves mid-sized volumes (0.1 to 3 GiB) room for other tenants.
_RESERVE_SHARE = 100
_RESERVE_MIN = 1024 * 1024
_RESERVE_MAX = 32 * 1024 * 1024
_WAL_PAGES = 128
# Counters of batches kept in memory because the spool could not be opened start here, above those of any
# earlier run's batches, so that both fit in one index once the spool opens (see retry_open).
_MEMORY_BASE = 10**11
_SETTINGS: dict[str, Any] = {
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

DropHook = Callable[[str, int, int], None]
_Disk = SafeDisk  # the name tests and tools opened the spool's cache with


@dataclass(frozen=True, slots=True)
class _Held:
    """A batch the disk refused, and the journal keys its samples still have on disk."""

    data: bytes
    journal: tuple[str, ...]


def _is_corrupt(exc: sqlite3.DatabaseError) -> bool:
    """A damaged or foreign database file, as opposed to a full, read-only, locked or failing disk."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        return type(exc) is sqlite3.DatabaseError
    return (code & 0xFF) in (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (named in the sqlite3 module from 3.11)


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored batch, described by its key alone."""

    counter: int
    created_ms: int
    size: int
    first_seq: int
    last_seq: int
    samples: int

    @property
    def key(self) -> str:
        fields = (self.created_ms, self.size, self.first_seq, self.last_seq, self.samples)
        return f"q.{self.counter:012d}." + ".".join(str(f) for f in fields)

    @classmethod
    def parse(cls, key: str) -> Entry | None:
        parts = key.split(".")
        if len(parts) != 7 or parts[0] != "q" or not all(p.isdigit() for p in parts[1:]):
            return None
        return cls(*(int(p) for p in parts[1:]))


class _Index:
    """The spool's entries, oldest first, as six packed columns of ``Entry``'s fields.

    A spool at its cap holds thousands of batches (about 9 000 at the default 256 MiB with 96-sample
    batches). As a dict of key strings and ``Entry`` objects that index took about 300 bytes an entry, as
    columns it takes about 50; ``Entry`` objects are built when asked for. Counters only grow, so an
    entry's row is found by bisection; a removed entry's size is set to -1, and the columns are rebuilt
    without those rows once they outnumber the rest. Iterators find their place again by counter, so the
    index may change while one is in use.
    """

    __slots__ = ("_cols", "_head", "_live")

    def __init__(self) -> None:
        self._cols: list[array[int]] = [array("q") for _ in range(6)]  # Entry's fields, in its order
        self._head = 0  # rows before it are all removed
        self._live = 0

    def __len__(self) -> int:
        return self._live

    def append(self, entry: Entry) -> None:
        counters = self._cols[0]
        if counters and entry.counter <= counters[-1]:
            raise ValueError(f"spool counters must grow: {entry.counter} after {counters[-1]}")
        for col, value in zip(self._cols, _fields(entry), strict=True):
            col.append(value)
        self._live += 1

    def __contains__(self, entry: object) -> bool:
        return isinstance(entry, Entry) and self._row(entry) >= 0

    def remove(self, entry: Entry) -> bool:
        """Forget ``entry``; False when it is not (or no longer) here."""
        row = self._row(entry)
        if row < 0:
            return False
        sizes = self._cols[2]
        sizes[row] = -1
        self._live -= 1
        while self._head < len(sizes) and sizes[self._head] < 0:
            self._head += 1
        removed = len(sizes) - self._live
        if removed > 256 and removed > self._live:
            rows = [i for i in range(self._head, len(sizes)) if sizes[i] >= 0]
            self._cols = [array("q", [col[i] for i in rows]) for col in self._cols]
            self._head = 0
        return True

    def oldest(self) -> Entry | None:
        return self._entry(self._head) if self._head < len(self._cols[0]) else None

    def newest(self) -> Entry | None:
        sizes = self._cols[2]
        for row in range(len(sizes) - 1, self._head - 1, -1):
            if sizes[row] >= 0:
                return self._entry(row)
        return None

    def __iter__(self) -> Iterator[Entry]:
        """Oldest first, up to the newest entry of the moment it is called."""
        counters = self._cols[0]
        if not counters:
            return
        last = counters[-1]
        row = self._head
        while True:
            counters, sizes = self._cols[0], self._cols[2]
            while row < len(sizes) and sizes[row] < 0:
                row += 1
            if row >= len(counters) or counters[row] > last:
                return
            entry = self._entry(row)
            yield entry
            row = bisect_right(self._cols[0], entry.counter, self._head)  # the columns may have changed

    def _row(self, entry: Entry) -> int:
        """The row holding ``entry`` (all fields equal), or -1."""
        counters = self._cols[0]
        row = bisect_left(counters, entry.counter, self._head)
        if row < len(counters) and all(
            col[row] == value for col, value in zip(self._cols, _fields(entry), strict=True)
        ):
            return row
        return -1

    def _entry(self, row: int) -> Entry:
        return Entry(*(col[row] for col in self._cols))


def _fields(entry: Entry) -> tuple[int, int, int, int, int, int]:
    return (entry.counter, entry.created_ms, entry.size, entry.first_seq, entry.last_seq, entry.samples)


def _entry_of(key: str) -> Entry:
    """The entry a queue key names (every field is in the key)."""
    entry = Entry.parse(key)
    if entry is None:
        raise ValueError(f"not a spool queue key: {key!r}")
    return entry


class Spool:
    def __init__(
        self,
        directory: str,
        max_bytes: int,
        max_age: float,
        on_drop: DropHook | None = None,
        clock: Callable[[], float] = boottime,
        age: SpoolClock | None = None,
    ) -> None:
        """``clock``: seconds on a clock that wall-clock steps do not move; ``age``: the whole spool time
        (``spool_clock``), when a test gives one."""
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._on_drop = on_drop or (lambda reason, batches, samples: None)
        self._age = age or SpoolClock(elapsed=clock)
        self.rejected: dict[str, int] = {}  # rows not read (never unpickled), by reason (spool_disk.Refused)
        self.wal_damaged = 0  # write-ahead logs SQLite would drop in part or whole
        self.wal_lost_bytes = 0
        self._cache: diskcache.Cache | None = None
        self._index = _Index()  # oldest first
        self._memory: dict[str, _Held] = {}  # entries the disk refused, oldest first
        self._memory_bytes = 0
        self._unreleased: dict[str, None] = {}  # keys gone from the index whose delete the disk refused
        self._bytes = 0
        self._counter = 0
        self.write_errors = 0
        self.disk_error = ""  # the last disk error, for logs and tests
        self._refusing = False  # the last write failed
        self._logged_at = -_LOG_EVERY
        self._reserve_drops = 0  # batches dropped to keep the reserve free (see _keep_reserve)
        # Keys of batches in flight (the forwarder keeps this): the caps, the age limit and the reserve pass
        # over them, so that a batch the broker is about to acknowledge is never also counted as dropped.
        self.pinned: set[str] = set()
        self._reserve_logged_at = -_LOG_EVERY

    # ------------------------------------------------------------------------------------- lifecycle

    def open(self) -> list[tuple[str, bytes]]:
        """Open (or create) the spool and rebuild the index; returns the journal left by a previous run."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._cache = self._open_cache()
            # Keys come in sort order, which for queue keys is counter order; they go straight into the
            # index, and only the others (journal, unknown: a handful) are kept to be dealt with after.
            others: list[Any] = []
            entries: list[Entry] = []  # only queue keys out of counter order, which sort order rules out
            clock_state: bytes | Refused | None = None
            for key in self._cache.iterkeys():
                entry = Entry.parse(key) if isinstance(key, str) else None
                if key == STATE_KEY:
                    clock_state = self._read(key)
                elif entry is None:
                    others.append(key)
                elif entries or (len(self._index) and entry.counter <= self._counter):
                    entries.append(entry)
                else:
                    self._index.append(entry)
                    self._bytes += entry.size
                    self._counter = entry.counter
        except _DISK_ERRORS as exc:
            self._index, self._bytes, self._counter = _Index(), 0, _MEMORY_BASE
            self._disk_failed("open", exc)
            if self._cache is not None:  # only the cache: batches held in memory stay (see retry_open)
                with contextlib.suppress(Exception):
                    self._cache.close()
                self._cache = None
            return []
        journal: list[tuple[str, bytes]] = []
        for key in others:
            if not isinstance(key, str):
                self._quarantine_key(key, "a key not stored as text")
                self._reject("key")
                self._on_drop("corrupt", 1, 0)
                continue
            if key.startswith("j."):
                data = self._read(key)
                if isinstance(data, bytes):
                    journal.append((key, data))
                else:
                    self._quarantine_key(key, "unreadable journal entry", data)
                    self._on_drop("corrupt", 0, 1)
                continue
            self._quarantine_key(key, "unknown key")
            self._on_drop("corrupt", 1, 0)
        if entries:
            kept = sorted([*self._index, *entries], key=lambda e: e.counter)
            self._index = _Index()
            self._bytes = 0
            for entry in kept:
                if len(self._index) and entry.counter <= self._counter:  # two keys, one counter
                    self._quarantine_key(entry.key, "duplicate counter")
                    self._on_drop("corrupt", 1, entry.samples)
                    continue
                self._index.append(entry)
                self._bytes += entry.size
                self._counter = entry.counter
        self._resume_clock(clock_state)
        return journal

    def _resume_clock(self, raw: bytes | Refused | None) -> None:
        newest = self._index.newest()
        how = self._age.resume(raw if isinstance(raw, bytes) else None, newest.created_ms if newest else None)
        if isinstance(raw, Refused):
            self._quarantine_key(STATE_KEY, "the clock state is not raw bytes", raw)
        log.debug("spool: spool time resumed (%s)", how)
        self._save_clock()

    def _save_clock(self) -> None:
        if self._cache is None:
            return
        try:
            self._cache.set(STATE_KEY, self._age.state())
        except _DISK_ERRORS as exc:  # only ages after a restart depend on it: said at debug level
            log.debug("spool: cannot save its clock state: %s", exc)

    @property
    def on_disk(self) -> bool:
        """False while the spool keeps everything in memory because it could not be opened."""
        return self._cache is not None

    def retry_open(self) -> list[tuple[str, bytes]] | None:
        """Open a spool that could not be opened before; the journal left by an earlier run, or None when
        it still cannot be opened. Batches held in memory meanwhile are written to it."""
        if self._cache is not None:
            return None
        index, size, counter = self._index, self._bytes, self._counter
        self._index, self._bytes, self._counter = _Index(), 0, 0
        quiet, self._refusing = self._refusing, True  # a failure again is no news: no new log line
        journal = self.open()
        self._refusing = quiet
        held = list(index)
        if self._cache is not None and held and self._counter >= held[0].counter:
            log.error("spool in %s holds batches numbered like those in memory; not merged", self.directory)
            self._cache.close()
            self._cache = None
        if self._cache is None:
            self._index, self._bytes, self._counter = index, size, counter
            return None
        for entry in held:
            self._index.append(entry)
        self._bytes += size
        self._counter = max(self._counter, counter)
        self._disk_ok()
        self._catch_up(limit=None)
        return journal

    def _open_cache(self) -> diskcache.Cache:
        self._check_wal()
        try:
            return diskcache.Cache(self.directory, disk=SafeDisk, **_SETTINGS)
        except sqlite3.DatabaseError as exc:
            if not _is_corrupt(exc):
                raise  # a full or failing disk: the database stays where it is, for the next start
            # An unreadable database: keep it for inspection and start afresh rather than stop forwarding.
            aside = os.path.join(self.directory, "corrupt", f"db-{int(time.time())}")
            os.makedirs(aside, exist_ok=True)
            for name in os.listdir(self.directory):
                if name.startswith("cache.db"):
                    os.replace(os.path.join(self.directory, name), os.path.join(aside, name))
            log.error(
                "spool database in %s is unreadable (%s); moved to %s, starting empty",
                self.directory,
                exc,
                aside,
            )
            self._on_drop("corrupt", 0, 0)
            return diskcache.Cache(self.directory, disk=SafeDisk, **_SETTINGS)

    def close(self) -> None:
        """Write what memory still holds to disk if it can now; what the disk still refuses is lost (counted).

        Samples whose journal entries reached the disk are not lost: the next start sends them.
        """
        self._catch_up(limit=None)
        if self._memory:
            lost = [max(0, _entry_of(key).samples - len(held.journal)) for key, held in self._memory.items()]
            batches, samples = sum(1 for n in lost if n), sum(lost)
            log.error(
                "spool: %d batches (%d samples not journaled) the disk in %s refused are lost (%s)",
                len(self._memory),
                samples,
                self.directory,
                self.disk_error or "no spool database",
            )
            if batches:
                self._on_drop("disk_full", batches, samples)
            self._memory.clear()
            self._memory_bytes = 0
        if self._unreleased:
            log.warning(
                "spool: %d entries in %s could not be deleted; the next start may send them again",
                len(self._unreleased),
                self.directory,
            )
            self._unreleased.clear()
        if self._cache is not None:
            self._save_clock()
            with contextlib.suppress(Exception):
                self._cache.close()
            self._cache = None

    # ------------------------------------------------------------------------------------- queue

    def put(self, data: bytes, first_seq: int, last_seq: int, samples: int, journal: Sequence[str] = ()) -> Entry:
        """Store a batch (and forget the journal keys it replaces, in the same transaction)."""
        self._counter += 1
        entry = Entry(self._counter, self._age.now_ms(), len(data), first_seq, last_seq, samples)
        if self._cache is None:
            self._hold(entry.key, data, journal)
        else:
            self._keep_reserve(len(data))  # before the entry is indexed: never the batch being written
            failure = self._write(entry.key, data, journal)
            if failure is None:
                self._disk_ok()
            else:
                self._disk_failed("write", failure)
                self._hold(entry.key, data, journal)
        self._index.append(entry)
        self._bytes += entry.size
        self._enforce_caps(keep=entry)
        if not self._refusing:
            self._catch_up()
        return entry

    def _write(self, key: str, data: bytes, journal: Sequence[str]) -> BaseException | None:
        """One batch and the deletion of its journal keys, in one transaction; the error when refused."""
        assert self._cache is not None
        disk = self._cache.disk
        disk.named.clear()
        try:
            with self._cache.transact():
                self._cache.set(key, data)
                for old in journal:
                    self._cache.delete(old)  # inline values: no file is removed before the commit
        except _DISK_ERRORS as exc:
            for name in disk.named:
                disk.remove(name)  # the value file of the row that was not written (errors suppressed)
            return exc
        finally:
            disk.named.clear()
        return None

    def _hold(self, key: str, data: bytes, journal: Sequence[str]) -> None:
        self._memory[key] = _Held(data, tuple(journal))
        self._memory_bytes += len(data)

    def _release(self, key: str) -> None:
        """Forget a stored batch: from memory with its journal keys, or from disk."""
        held = self._memory.pop(key, None)
        if held is None:
            self._delete(key)
            return
        self._memory_bytes -= len(held.data)
        for old in held.journal:
            self._delete(old)

    def get(self, entry: Entry) -> bytes | None:
        """The stored bytes, or None when the entry vanished or cannot be read (counted as corrupt)."""
        held = self._memory.get(entry.key)
        if held is not None:
            return held.data
        if entry not in self._index:
            return None
        data = self._read(entry.key)
        if isinstance(data, Refused):
            self._reject(data.reason)
            self.quarantine(entry, data.data, f"stored as {data.reason}, not raw bytes; never read")
            return None
        if data is None or len(data) != entry.size:
            self.quarantine(entry, data, "unreadable or truncated")
            return None
        return data

    def remove(self, entry: Entry) -> bool:
        """Forget an acknowledged batch; False when it was already gone (evicted meanwhile)."""
        if not self._index.remove(entry):
            return False
        self._bytes -= entry.size
        self._release(entry.key)
        return True

    def quarantine(self, entry: Entry, data: bytes | None, why: str) -> None:
        """Move a corrupt entry aside (a file under corrupt/) and count it."""
        if not self._index.remove(entry):
            return
        self._bytes -= entry.size
        self._release(entry.key)
        if data is not None:
            self._save_aside(entry.key, data)
        log.warning("spool entry %s is corrupt (%s); moved aside", entry.key, why)
        self._on_drop("corrupt", 1, entry.samples)

    def oldest(self) -> Entry | None:
        return self._index.oldest()

    def newest(self) -> Entry | None:
        return self._index.newest()

    def entries(self) -> Iterator[Entry]:
        """Oldest first, up to the newest of the moment; safe to modify the spool while iterating (an entry
        removed meanwhile is skipped)."""
        return iter(self._index)

    def entries_view(self) -> Iterator[Entry]:
        """Oldest first (the same iterator as ``entries``: the index is never copied)."""
        return iter(self._index)

    def __contains__(self, entry: Entry) -> bool:
        return entry in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def oldest_age(self) -> float:
        oldest = self.oldest()
        return 0.0 if oldest is None else max(0.0, (self._age.now_ms() - oldest.created_ms) / 1000)

    def expire(self) -> int:
        """Drop batches older than ``max_age``; returns how many went. Called periodically, it also
        retries what the disk refused (see ``close``) and keeps the reserve free (see ``_keep_reserve``)."""
        self._catch_up()
        self._keep_reserve()
        if self._age.due():
            self._save_clock()
        limit_ms = self._age.now_ms() - self.max_age * 1000
        gone = 0
        for entry in self.entries():
            if entry.created_ms >= limit_ms:
                break
            if entry.key not in self.pinned:
                self._drop(entry, "max_age")
                gone += 1
        return gone

    def _enforce_caps(self, keep: Entry) -> None:
        for entry in self.entries():
            if self._bytes <= self.max_bytes:
                break
            if (entry == keep and len(self._index) > 1) or entry.key in self.pinned:
                continue
            self._drop(entry, "max_bytes")
        for key in list(self._memory):
            if self._memory_bytes <= _MEMORY_CAP:
                break
            if key not in self.pinned:
                self._drop(_entry_of(key), "disk_full")

    def _drop(self, entry: Entry, reason: str) -> None:
        if not self._index.remove(entry):
            return
        self._bytes -= entry.size
        self._release(entry.key)
        log.debug("spool: dropped batch %d-%d (%s)", entry.first_seq, entry.last_seq, reason)
        self._on_drop(reason, 1, entry.samples)

    # ------------------------------------------------------------------------------------- journal

    def journal(self, boot: str, seq: int, data: bytes) -> str | None:
        """Record one sample of the open batch; returns its key, or None when the disk refused it."""
        key = f"j.{boot}.{seq:012d}"
        if self._cache is None:
            return None
        try:
            self._cache.set(key, data)
        except _DISK_ERRORS as exc:
            self._disk_failed("journal", exc)
            return None
        self._disk_ok()
        self._catch_up()
        return key

    def forget_journal(self, keys: list[str]) -> None:
        for key in keys:
            self._delete(key)

    # ------------------------------------------------------------------------------------- helpers

    def _catch_up(self, limit: int | None = _CATCH_UP_BYTES) -> None:
        """Retry the deletes the disk refused, then write memory-held batches to disk, oldest first.

        A retry the disk refuses again is not counted: the write or delete it repeats was counted once.
        """
        if self._cache is None or not (self._unreleased or self._memory):
            return
        for key in list(self._unreleased):
            try:
                self._cache.delete(key)  # its own transaction: a value file goes only after the commit
            except _DISK_ERRORS:
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
            except _DISK_ERRORS:
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
        with contextlib.suppress(*_DISK_ERRORS, AttributeError):
            self._cache._sql("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        self._reserve_drops += batches
        now = time.monotonic()
        if now - self._reserve_logged_at >= _LOG_EVERY:
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
        except (*_DISK_ERRORS, ValueError, TypeError) as exc:
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
        except _DISK_ERRORS as exc:
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
            self._cache = diskcache.Cache(self.directory, disk=SafeDisk, **_SETTINGS)
        except _DISK_ERRORS as again:
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
        if isinstance(exc, sqlite3.DatabaseError) and _is_corrupt(exc) and self._cache is not None:
            self._corrupt_now(exc)
            return
        self.write_errors += 1
        self.disk_error = f"{op}: {exc}"
        now = time.monotonic()
        if not self._refusing or now - self._logged_at >= _LOG_EVERY:
            self._logged_at = now
            log.error(
                "spool %s in %s failed: %s (batches are kept in memory, up to %d MiB; %d refused writes so far)",
                op,
                self.directory,
                exc,
                _MEMORY_CAP // (1024 * 1024),
                self.write_errors,
            )
        self._refusing = True

    def _disk_ok(self) -> None:
        if self._refusing:
            self._refusing = False
            log.warning("spool in %s takes writes again after %d refused", self.directory, self.write_errors)
