"""HTTP basic authentication against bcrypt hashes, with successful checks cached.

bcrypt is slow by design (tens of milliseconds at cost 10); a scraper sends the same credentials every
scrape, so a check that succeeded once is remembered (by a SHA-256 of user and password, never the
password itself) and the next scrape costs a dictionary lookup. Failures are not cached: each wrong
password costs a full bcrypt round, as it should.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections.abc import Mapping

__all__ = ["BasicAuth"]

_CACHE_MAX = 1024
# A valid hash of a random password, checked for unknown users so that they take as long as known ones.
_DUMMY_HASH = b"$2b$10$9t6fdMlq2QG05JwNeCbr0O5zhQ8JeCzp/Lvt.33rx9JNB95.wn5/O"


class BasicAuth:
    def __init__(self, users: Mapping[str, str]) -> None:
        self._users = {user: hashed.encode() for user, hashed in users.items()}
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._users)

    def check(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header holds a known user and the right password."""
        if not authorization or authorization[:6].lower() != "basic ":
            return False
        try:
            decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, sep, password = decoded.partition(":")
        if not sep:
            return False
        key = hashlib.sha256(f"{len(user)}:{user}:{password}".encode()).digest()
        with self._lock:
            if key in self._ok:
                return True
        import bcrypt

        hashed = self._users.get(user)
        try:
            good = bcrypt.checkpw(password.encode("utf-8"), hashed or _DUMMY_HASH)
        except ValueError:  # a hash bcrypt cannot read (checked at load, so not expected)
            good = False
        if not (good and hashed is not None):
            return False
        with self._lock:
            if len(self._ok) >= _CACHE_MAX:
                self._ok.clear()
            self._ok.add(key)
        return True
