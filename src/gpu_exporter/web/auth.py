"""HTTP basic authentication against bcrypt hashes: cheap for a scraper, bounded under a flood.

- A pair that passed is remembered: the next scrape with it costs a dictionary lookup, never a wait.
- A pair that failed is remembered too, for ``_BAD_TTL`` seconds: sent again, it is refused at once.
- Only a pair never seen costs bcrypt, on the bounded pool of ``authpool.py``: a flood of fresh wrong
  passwords fills a short queue (the rest answered 429 at once) and never every connection.
- An unknown user is checked against a configured hash (the costliest), so it takes exactly as long as a
  known user with a wrong password: the answer time does not tell which user names exist.
- Past 72 bytes a password counts with its first 72 only: bcrypt reads no more, and the exporter toolkit
  (Go's ``bcrypt.CompareHashAndPassword``) lets such a password in when its first 72 bytes match.
  pyca/bcrypt 5 raises for longer passwords instead; they are cut here, so the same passwords work.

Remembered pairs are keyed by an HMAC (a random key per process) of the user, the hash and the password:
neither a password nor a fast unsalted digest of it stays in memory, and a pair stops matching when the
user's hash changes in a reloaded file. The memory (``AuthState``) belongs to the server and outlives
reloads.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from gpu_exporter.web.authpool import CheckPool, Job

__all__ = ["AuthState", "BasicAuth", "Verdict"]

_GOOD_MAX = 1024  # pairs that passed
_BAD_MAX = 4096  # pairs that failed, kept _BAD_TTL seconds
_BAD_TTL = 300.0
_TICKETS_MAX = 4096  # pairs waiting for a check, with the time they were first seen
_BCRYPT_MAX = 72  # bytes of a password bcrypt reads


class Verdict(enum.Enum):
    OK = "ok"
    DENIED = "denied"
    BUSY = "busy"  # no check could be made in time: answered 429
    GONE = "gone"  # the connection was closed to make room while its check waited


class AuthState:
    """What the server remembers across web config reloads: checked pairs, tickets, the check pool."""

    def __init__(self, pool: CheckPool | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.pool = pool or CheckPool()
        self._secret = os.urandom(32)
        self._clock = clock
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._bad: OrderedDict[bytes, float] = OrderedDict()  # key -> when it failed
        self._tickets: OrderedDict[bytes, float] = OrderedDict()  # key -> first seen
        self._lock = threading.Lock()
        self.remembered_good = 0  # requests let in by a remembered pair
        self.remembered_bad = 0  # requests refused by a remembered failure (no bcrypt)

    def key(self, known: bool, user: bytes, hashed: bytes, password: bytes) -> bytes:
        msg = b"%d:%d:%d:" % (known, len(user), len(hashed)) + user + hashed + password
        return hmac.new(self._secret, msg, hashlib.sha256).digest()

    def recall(self, key: bytes) -> bool | None:
        """True or False when the pair was checked (recently, for a failure), None when it must be."""
        now = self._clock()
        with self._lock:
            if key in self._good:
                self.remembered_good += 1
                return True
            failed = self._bad.get(key)
            if failed is not None:
                if now - failed < _BAD_TTL:
                    self.remembered_bad += 1
                    return False
                del self._bad[key]
        return None

    def remember(self, key: bytes, ok: bool) -> None:
        with self._lock:
            self._tickets.pop(key, None)
            if ok:
                self._good[key] = None
                while len(self._good) > _GOOD_MAX:
                    self._good.popitem(last=False)
            else:
                self._bad[key] = self._clock()
                self._bad.move_to_end(key)
                while len(self._bad) > _BAD_MAX:
                    self._bad.popitem(last=False)

    def ticket(self, key: bytes, suspect: bool) -> tuple[int, float]:
        """The pair's rank in the check queue, lowest first: a pair sent again while its first check was
        refused or never ran (0, first seen); then a pair seen for the first time (1, now), or (2, now) on
        a connection whose last request was refused."""
        now = self._clock()
        with self._lock:
            first = self._tickets.get(key)
            if first is None:
                self._tickets[key] = now
                while len(self._tickets) > _TICKETS_MAX:
                    self._tickets.popitem(last=False)
                return 2 if suspect else 1, now
            return 0, first


def parse_basic(authorization: str | None) -> tuple[bytes, bytes] | None:
    """(user, password) of a ``Basic`` header, as Go's ``Request.BasicAuth`` reads it; None otherwise."""
    if not authorization or authorization[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


def _cost(hashed: bytes) -> int:
    return int(hashed.split(b"$")[2])


class BasicAuth:
    def __init__(self, users: Mapping[str, str], state: AuthState | None = None) -> None:
        self._users = {user.encode("utf-8", "surrogateescape"): hashed.encode() for user, hashed in users.items()}
        # Checked for unknown users: a configured hash (the costliest), so both take the same time.
        self._decoy = max(self._users.values(), key=_cost) if self._users else b""
        self.state = state or AuthState()

    def __bool__(self) -> bool:
        return bool(self._users)

    def check(
        self,
        authorization: str | None,
        queued: Callable[[Job | None], None] | None = None,
        timeout: float = 10.0,
        suspect: bool = False,
    ) -> Verdict:
        """The verdict on an ``Authorization`` header. ``queued`` is told the check while it waits in the
        pool (and None after), so that the server may close its connection to make room; ``suspect``: the
        connection's last request was refused (a new pair from it ranks after others, ``AuthState.ticket``)."""
        pair = parse_basic(authorization)
        if pair is None:
            return Verdict.DENIED
        user, password = pair
        hashed = self._users.get(user)
        known = hashed is not None
        target = hashed if hashed is not None else self._decoy
        key = self.state.key(known, user, target, password)
        recalled = self.state.recall(key)
        if recalled is not None:
            return Verdict.OK if recalled and known else Verdict.DENIED
        state = self.state

        def run() -> bool:
            ok = _checkpw(password, target)
            state.remember(key, ok and known)  # also when the request gave up waiting: its retry is a lookup
            return ok

        job = state.pool.submit(state.ticket(key, suspect), run)
        if job is None:
            return Verdict.BUSY
        if queued is not None:
            queued(job)
        try:
            outcome = job.wait(timeout)
        finally:
            if queued is not None:
                queued(None)
        if outcome == "busy":
            return Verdict.BUSY
        if outcome == "cancelled":
            return Verdict.GONE
        return Verdict.OK if outcome is True and known else Verdict.DENIED


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bool(bcrypt.checkpw(password[:_BCRYPT_MAX], hashed))
    except ValueError:  # a hash bcrypt cannot read (checked at load, so not expected)
        return False
