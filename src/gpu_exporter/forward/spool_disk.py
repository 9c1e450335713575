"""What the spool reads from its SQLite database and its files: raw bytes, nothing else.

diskcache's ``Disk.fetch`` unpickles a row whose mode is 4 (pickle), and ``Disk.get`` unpickles a key
stored as not raw, whatever the spool stored: whoever can write the spool directory (a hostPath) could
run code as the agent. ``SafeDisk`` reads raw bytes only:

- A value in any other form (pickle, text, a raw number or string, an unknown mode) comes back as a
  ``Refused`` holding the row's stored bytes, never interpreted, so the spool moves it aside and counts it.
- A value in a file (mode binary) is read only from a name of the form diskcache gives its files
  (``ab/cd/<28 hex>.val`` under the spool directory); another name (``../../etc/shadow``, an absolute
  path) is refused, and never removed either.
- A key stored as not raw comes back as a ``ForeignKey`` holding its bytes, never unpickled; the spool
  can still delete that row by it.
- Writes take bytes only: nothing the spool stores is ever pickled.

``check_wal`` looks at the write-ahead log before SQLite opens the database: SQLite silently drops a WAL
whose header is damaged, and every frame after one whose checksum fails, with the batches committed in
them. The spool cannot tell which batches those were (they are in the damaged frames), so it keeps the
file aside, says so and counts it with its size.
"""

from __future__ import annotations

import os
import re
import sqlite3
import struct
from dataclasses import dataclass
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, MODE_PICKLE, MODE_RAW, MODE_TEXT, UNKNOWN

__all__ = ["ForeignKey", "Refused", "SafeDisk", "WalDamage", "check_wal"]

_FILENAME = re.compile(r"[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{28}\.val")
_FILE_MAX = 64 * 1024 * 1024  # bytes read from a value file (a batch is far smaller)


@dataclass(frozen=True, slots=True)
class Refused:
    """A row the spool does not read: ``reason`` is pickle, text, not_bytes, file or mode."""

    reason: str
    data: bytes | None = None  # what the row stored, as bytes, for the copy kept aside


@dataclass(frozen=True, slots=True)
class ForeignKey:
    """A key stored as not raw (diskcache pickles keys that are not str, bytes or numbers)."""

    blob: bytes

    def __str__(self) -> str:
        return f"<not-raw key of {len(self.blob)} bytes>"


class SafeDisk(diskcache.Disk):  # type: ignore[misc]
    """diskcache's Disk, reading and writing raw bytes only (see the module doc); it also remembers the
    value files it names, so that a refused write does not leave them behind."""

    def __init__(self, directory: str, **settings: Any) -> None:
        super().__init__(directory, **settings)
        self.named: list[str] = []

    # keys
    def put(self, key: Any) -> tuple[Any, bool]:
        """A key as the database holds it: the spool's are text; a raw key of another type found in the
        database (bytes, a number) and a ``ForeignKey`` are given back as they were stored, so that
        their rows can be deleted. Nothing is ever pickled."""
        kind = type(key)
        if kind is str:
            return key, True
        if kind is ForeignKey:
            return sqlite3.Binary(key.blob), False
        if kind is bytes:
            return sqlite3.Binary(key), True
        if kind is float or (kind is int and -(2**63) <= key < 2**63):
            return key, True
        raise TypeError(f"the spool's keys are str, not {kind.__name__}")

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            return ForeignKey(bytes(key) if isinstance(key, (bytes, bytearray, memoryview)) else str(key).encode())
        return bytes(key) if type(key) is sqlite3.Binary else key

    # values
    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str | None, Any]:
        if type(value) is not bytes:
            raise TypeError(f"the spool stores bytes, not {type(value).__name__}")
        return super().store(value, read, key)  # type: ignore[no-any-return]

    def fetch(self, mode: int, filename: str | None, value: Any, read: bool) -> Any:
        if read:
            raise TypeError("the spool reads values whole, never as open files")
        if mode == MODE_RAW:
            if isinstance(value, (bytes, bytearray, memoryview)):
                return bytes(value)
            return Refused("not_bytes", str(value).encode(errors="replace")[:_FILE_MAX])
        if mode == MODE_BINARY:
            data = self._file(filename)
            return data if data is not None else Refused("file")
        reason = {MODE_PICKLE: "pickle", MODE_TEXT: "text"}.get(mode, "mode")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return Refused(reason, bytes(value))
        return Refused(reason, self._file(filename))

    def _file(self, filename: str | None) -> bytes | None:
        """The bytes of a value file with a name diskcache gives; None for any other name."""
        if not isinstance(filename, str) or not _FILENAME.fullmatch(filename):
            return None
        path = os.path.join(self._directory, filename)
        try:
            with open(path, "rb") as handle:
                return handle.read(_FILE_MAX)
        except OSError as exc:
            raise OSError(exc.errno, f"spool value file {filename}: {exc.strerror}") from None

    def filename(self, key: Any = UNKNOWN, value: Any = UNKNOWN) -> tuple[str, str]:
        name, full_path = super().filename(key, value)
        self.named.append(name)
        return name, full_path

    def remove(self, file_path: str) -> None:
        if isinstance(file_path, str) and _FILENAME.fullmatch(file_path):
            super().remove(file_path)


# --- the write-ahead log ---

_WAL_MAGIC = (0x377F0682, 0x377F0683)  # checksums in little-, big-endian words
_WAL_VERSION = 3007000
_WAL_CHECK_MAX = 32 * 1024 * 1024  # bytes of frames whose checksums are verified (a normal WAL is < 2 MiB)
# SQLite adds 1 to salt-1 each time it starts the WAL again from its beginning: a frame of an earlier
# generation has a salt-1 a little below the header's; a random one almost never does.
_GENERATIONS = 1 << 20


@dataclass(frozen=True, slots=True)
class WalDamage:
    """What SQLite will drop of a write-ahead log: ``lost`` bytes from ``offset`` on."""

    size: int
    offset: int
    why: str

    @property
    def lost(self) -> int:
        return self.size - self.offset


def _checksum(data: bytes, big: bool, s0: int, s1: int) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


def check_wal(path: str) -> WalDamage | None:
    """The damage in the WAL at ``path`` (SQLite's format: a 32-byte header, then frames of a 24-byte
    header and a page, checksummed in a chain), or None when it is absent, empty or sound.

    Frames after the last sound one that belong to an earlier generation of the WAL (a salt-1 a little
    below the header's) are what a WAL restarted over an older one leaves behind: no loss. A frame with
    the header's salts and a wrong checksum is damage, and so is one of no generation, and a header that
    is not one.
    """
    try:
        size = os.path.getsize(path)
        if size < 32:
            return None  # empty, or a header cut short: no frame was ever committed in it
        with open(path, "rb") as handle:
            header = handle.read(32)
            magic, version, page, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I", header)
            if magic not in _WAL_MAGIC or version != _WAL_VERSION:
                return WalDamage(size, 32, "its header is not a SQLite WAL header")
            page = 65536 if page == 1 else page
            if page < 512 or page > 65536 or page & (page - 1):
                return WalDamage(size, 32, f"its header gives a page size of {page}")
            big = magic & 1 == 1
            s0, s1 = _checksum(header[:24], big, 0, 0)
            if (s0, s1) != (c0, c1):
                return WalDamage(size, 32, "its header checksum is wrong")
            offset = 32
            while offset + 24 + page <= min(size, 32 + _WAL_CHECK_MAX):
                frame = handle.read(24 + page)
                _pgno, _commit, f1, f2, k0, k1 = struct.unpack(">6I", frame[:24])
                if (f1, f2) != (salt1, salt2):
                    if 0 < (salt1 - f1) & 0xFFFFFFFF < _GENERATIONS:
                        return None  # left over from before the WAL restarted
                    return WalDamage(size, offset, f"the frame at byte {offset} belongs to no WAL generation")
                s0, s1 = _checksum(frame[:8] + frame[24:], big, s0, s1)
                if (s0, s1) != (k0, k1):
                    return WalDamage(size, offset, f"the checksum of the frame at byte {offset} is wrong")
                offset += 24 + page
    except OSError:
        return None  # unreadable: SQLite will say so when it opens the database
    return None
