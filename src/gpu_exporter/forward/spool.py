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
kept in memory instead, within a small bound, and ``write_errors`` counts the failures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import diskcache

__all__ = ["Entry", "Spool"]

log = logging.getLogger(__name__)

_MEMORY_CAP = 8 * 1024 * 1024  # bytes kept in memory while the disk refuses writes
_CORRUPT_KEEP = 20  # quarantined files kept for inspection
_SETTINGS: dict[str, Any] = {
    "eviction_policy": "none",  # the caps are enforced here, counted, oldest first
    "size_limit": 2**62,
    "cull_limit": 0,
    "statistics": 0,
    "tag_index": 0,
    "sqlite_cache_size": 256,  # pages: ~1 MiB of SQLite cache instead of 32 MiB
    "sqlite_mmap_size": 0,  # no mmap: keeps RSS small while a full spool drains
    "sqlite_synchronous": 1,  # NORMAL with WAL: survives a killed process
}

DropHook = Callable[[str, int, int], None]


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


class Spool:
    def __init__(
        self,
        directory: str,
        max_bytes: int,
        max_age: float,
        on_drop: DropHook | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age = max_age
        self._on_drop = on_drop or (lambda reason, batches, samples: None)
        self._clock = clock
        self._cache: diskcache.Cache | None = None
        self._index: dict[str, Entry] = {}  # insertion order == counter order == oldest first
        self._memory: dict[str, bytes] = {}  # entries the disk refused
        self._bytes = 0
        self._counter = 0
        self.write_errors = 0
        self.disk_error = ""  # the last disk error, for logs and tests

    # ------------------------------------------------------------------------------------- lifecycle

    def open(self) -> list[tuple[str, bytes]]:
        """Open (or create) the spool and rebuild the index; returns the journal left by a previous run."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            self._cache = self._open_cache()
            keys = list(self._cache.iterkeys())
        except (OSError, sqlite3.Error) as exc:
            self._disk_failed("open", exc)
            self._cache = None
            return []
        journal: list[tuple[str, bytes]] = []
        entries: list[Entry] = []
        for key in keys:
            if not isinstance(key, str):
                self._quarantine_key(key, "unknown key")
                continue
            if key.startswith("j."):
                data = self._read(key)
                if data is None:
                    self._quarantine_key(key, "unreadable journal entry")
                    self._on_drop("corrupt", 0, 1)
                else:
                    journal.append((key, data))
                continue
            entry = Entry.parse(key)
            if entry is None:
                self._quarantine_key(key, "unknown key")
                self._on_drop("corrupt", 1, 0)
                continue
            entries.append(entry)
        for entry in sorted(entries, key=lambda e: e.counter):
            self._index[entry.key] = entry
            self._bytes += entry.size
        self._counter = max((e.counter for e in entries), default=0)
        return journal

    def _open_cache(self) -> diskcache.Cache:
        try:
            return diskcache.Cache(self.directory, **_SETTINGS)
        except sqlite3.DatabaseError as exc:
            # An unreadable database: keep it for inspection and start afresh rather than stop forwarding.
            aside = os.path.join(self.directory, "corrupt", f"db-{int(self._clock())}")
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
            return diskcache.Cache(self.directory, **_SETTINGS)

    def close(self) -> None:
        if self._cache is not None:
            with contextlib.suppress(Exception):
                self._cache.close()
            self._cache = None

    # ------------------------------------------------------------------------------------- queue

    def put(self, data: bytes, first_seq: int, last_seq: int, samples: int, journal: Sequence[str] = ()) -> Entry:
        """Store a batch (and forget the journal keys it replaces, in the same transaction)."""
        self._counter += 1
        entry = Entry(self._counter, int(self._clock() * 1000), len(data), first_seq, last_seq, samples)
        stored = False
        if self._cache is not None:
            try:
                with self._cache.transact():
                    self._cache.set(entry.key, data)
                    for key in journal:
                        self._cache.delete(key)
                stored = True
            except (OSError, sqlite3.Error) as exc:
                self._disk_failed("write", exc)
        if not stored:
            self._memory[entry.key] = data
        self._index[entry.key] = entry
        self._bytes += entry.size
        self._enforce_caps(keep=entry)
        return entry

    def get(self, entry: Entry) -> bytes | None:
        """The stored bytes, or None when the entry vanished or cannot be read (counted as corrupt)."""
        if entry.key in self._memory:
            return self._memory[entry.key]
        if entry.key not in self._index:
            return None
        data = self._read(entry.key)
        if data is None or len(data) != entry.size:
            self.quarantine(entry, data, "unreadable or truncated")
            return None
        return data

    def remove(self, entry: Entry) -> bool:
        """Forget an acknowledged batch; False when it was already gone (evicted meanwhile)."""
        if self._index.pop(entry.key, None) is None:
            return False
        self._bytes -= entry.size
        if self._memory.pop(entry.key, None) is None:
            self._delete(entry.key)
        return True

    def quarantine(self, entry: Entry, data: bytes | None, why: str) -> None:
        """Move a corrupt entry aside (a file under corrupt/) and count it."""
        if self._index.pop(entry.key, None) is None:
            return
        self._bytes -= entry.size
        self._memory.pop(entry.key, None)
        self._delete(entry.key)
        if data is not None:
            self._save_aside(entry.key, data)
        log.warning("spool entry %s is corrupt (%s); moved aside", entry.key, why)
        self._on_drop("corrupt", 1, entry.samples)

    def oldest(self) -> Entry | None:
        return next(iter(self._index.values()), None)

    def newest(self) -> Entry | None:
        return next(reversed(self._index.values()), None)

    def entries(self) -> Iterator[Entry]:
        """Oldest first; a snapshot, safe to modify the spool while iterating."""
        return iter(list(self._index.values()))

    def entries_view(self) -> Iterator[Entry]:
        """Oldest first, without a copy: do not modify the spool while iterating."""
        return iter(self._index.values())

    def __contains__(self, entry: Entry) -> bool:
        return entry.key in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def total_bytes(self) -> int:
        return self._bytes

    def oldest_age(self) -> float:
        oldest = self.oldest()
        return 0.0 if oldest is None else max(0.0, self._clock() - oldest.created_ms / 1000)

    def expire(self) -> int:
        """Drop batches older than ``max_age``; returns how many went."""
        limit_ms = (self._clock() - self.max_age) * 1000
        gone = 0
        for entry in self.entries():
            if entry.created_ms >= limit_ms:
                break
            self._drop(entry, "max_age")
            gone += 1
        return gone

    def _enforce_caps(self, keep: Entry) -> None:
        for entry in self.entries():
            if self._bytes <= self.max_bytes:
                break
            if entry is keep and len(self._index) > 1:
                continue
            self._drop(entry, "max_bytes")
        memory = sum(len(v) for v in self._memory.values())
        for key in list(self._memory):
            if memory <= _MEMORY_CAP:
                break
            memory -= len(self._memory[key])
            self._drop(self._index[key], "disk_full")

    def _drop(self, entry: Entry, reason: str) -> None:
        if self._index.pop(entry.key, None) is None:
            return
        self._bytes -= entry.size
        if self._memory.pop(entry.key, None) is None:
            self._delete(entry.key)
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
        except (OSError, sqlite3.Error) as exc:
            self._disk_failed("journal", exc)
            return None
        return key

    def forget_journal(self, keys: list[str]) -> None:
        for key in keys:
            self._delete(key)

    # ------------------------------------------------------------------------------------- helpers

    def _read(self, key: str) -> bytes | None:
        if self._cache is None:
            return None
        try:
            value = self._cache.get(key)
        except (OSError, sqlite3.Error, ValueError) as exc:
            log.warning("spool: cannot read %s: %s", key, exc)
            return None
        return value if isinstance(value, bytes) else None

    def _delete(self, key: str) -> None:
        if self._cache is None:
            return
        try:
            self._cache.delete(key)
        except (OSError, sqlite3.Error) as exc:
            self._disk_failed("delete", exc)

    def _quarantine_key(self, key: Any, why: str) -> None:
        data = self._read(key) if isinstance(key, str) else None
        self._delete(key)
        if data is not None:
            self._save_aside(str(key), data)
        log.warning("spool entry %r: %s; moved aside", key, why)

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

    def _disk_failed(self, op: str, exc: BaseException) -> None:
        self.write_errors += 1
        message = f"{op}: {exc}"
        if message != self.disk_error:
            log.error(
                "spool %s in %s failed: %s (batches are kept in memory, up to %d MiB)",
                op,
                self.directory,
                exc,
                _MEMORY_CAP // (1024 * 1024),
            )
        self.disk_error = message
