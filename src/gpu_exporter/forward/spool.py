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
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import diskcache

from gpu_exporter.forward.spool_clock import STATE_KEY, SpoolClock, boottime
from gpu_exporter.forward.spool_disk import Refused, SafeDisk
from gpu_exporter.forward.spool_faults import (
    DISK_ERRORS,
    LOG_EVERY,
    MEMORY_CAP,
    SETTINGS,
    DiskFaults,
    Held,
    is_corrupt,
)
from gpu_exporter.forward.spool_index import Entry, Index, entry_of

__all__ = ["Entry", "Spool"]

log = logging.getLogger(__name__)

# Counters of batches kept in memory because the spool could not be opened start here, above those of any
# earlier run's batches, so that both fit in one index once the spool opens (see retry_open).
_MEMORY_BASE = 10**11

DropHook = Callable[[str, int, int], None]


class Spool(DiskFaults):
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
        self._index = Index()  # oldest first
        self._memory: dict[str, Held] = {}  # entries the disk refused, oldest first
        self._memory_bytes = 0
        self._unreleased: dict[str, None] = {}  # keys gone from the index whose delete the disk refused
        self._bytes = 0
        self._counter = 0
        self.write_errors = 0
        self.disk_error = ""  # the last disk error, for logs and tests
        self._refusing = False  # the last write failed
        self._logged_at = -LOG_EVERY
        self._reserve_drops = 0  # batches dropped to keep the reserve free (see _keep_reserve)
        # Keys of batches in flight (the forwarder keeps this): the caps, the age limit and the reserve pass
        # over them, so that a batch the broker is about to acknowledge is never also counted as dropped.
        self.pinned: set[str] = set()
        self._reserve_logged_at = -LOG_EVERY

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
        except DISK_ERRORS as exc:
            self._index, self._bytes, self._counter = Index(), 0, _MEMORY_BASE
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
            self._index = Index()
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
        except DISK_ERRORS as exc:  # only ages after a restart depend on it: said at debug level
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
        self._index, self._bytes, self._counter = Index(), 0, 0
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
            return diskcache.Cache(self.directory, disk=SafeDisk, **SETTINGS)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
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
            return diskcache.Cache(self.directory, disk=SafeDisk, **SETTINGS)

    def close(self) -> None:
        """Write what memory still holds to disk if it can now; what the disk still refuses is lost (counted).

        Samples whose journal entries reached the disk are not lost: the next start sends them.
        """
        self._catch_up(limit=None)
        if self._memory:
            lost = [max(0, entry_of(key).samples - len(held.journal)) for key, held in self._memory.items()]
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
        except DISK_ERRORS as exc:
            for name in disk.named:
                disk.remove(name)  # the value file of the row that was not written (errors suppressed)
            return exc
        finally:
            disk.named.clear()
        return None

    def _hold(self, key: str, data: bytes, journal: Sequence[str]) -> None:
        self._memory[key] = Held(data, tuple(journal))
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
            if self._memory_bytes <= MEMORY_CAP:
                break
            if key not in self.pinned:
                self._drop(entry_of(key), "disk_full")

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
        except DISK_ERRORS as exc:
            self._disk_failed("journal", exc)
            return None
        self._disk_ok()
        self._catch_up()
        return key

    def forget_journal(self, keys: list[str]) -> None:
        for key in keys:
            self._delete(key)
