"""Every read of a host file (sysfs, procfs, debugfs): bounded in bytes and in time, never stuck.

A host file is not always what its name promises. A sysfs attribute behind a hung I2C bus (an INA3221
rail monitor) is a regular file whose ``read()`` never returns; a bind mount or a hostile container can
put a FIFO, ``/dev/zero`` or an endless file where ``/proc/meminfo`` should be. So a read here:

- is refused when the path is not a regular file (a FIFO, a character or block device, a socket), checked
  before the file is opened (opening a device can start it: a watchdog) and again on the open file;
- is opened with ``O_NONBLOCK`` and costs at most ``cap`` bytes: a longer file is refused, not truncated;
- runs in a reader thread and is waited for at most ``timeout`` seconds. A read still running then is left
  to its thread (nothing can take back a read blocked in the kernel): that file is *stuck*, and every read
  of it is refused at once until the stuck read returns; so a hung file costs its caller one wait, once,
  holds one thread at most, and at most ``MAX_STUCK`` threads are ever held for all files together.

Refusals raise ``Refused``, an ``OSError``, so a caller's ``except OSError`` (a missing or unreadable file)
takes them too and leaves that one value out. Each is counted in ``failures`` by reason (``REASONS``), for
``gpu_exporter_host_read_failures_total{reason}``; an ordinary ``OSError`` (missing, permission) is the
caller's to count. Reads come from any thread (the sampler, pod attribution, doctor).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
import time
from collections import Counter
from pathlib import Path

__all__ = [
    "CAP",
    "MAX_STUCK",
    "REASONS",
    "TIMEOUT",
    "Refused",
    "failures",
    "read_bytes",
    "read_text",
    "stuck",
]

log = logging.getLogger(__name__)

CAP = 64 * 1024  # bytes: a sysfs attribute is at most a page (64 KiB on some arm64 kernels), meminfo ~2 KB
TIMEOUT = 0.5  # seconds: a sysfs read over I2C takes milliseconds
MAX_STUCK = 32  # reader threads held by stuck reads, all files together
_MAX_IDLE = 2  # reader threads kept waiting for work
_CHUNK = 64 * 1024

# not_regular: a FIFO, device or socket; too_large: over the cap; timeout: a read that did not return in
# time (its file is stuck from then on); stuck: refused because an earlier read of the file still runs;
# busy: refused because MAX_STUCK reads are stuck
REASONS = ("not_regular", "too_large", "timeout", "stuck", "busy")


class Refused(OSError):
    """A host read refused or given up; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, path: str, detail: str) -> None:
        super().__init__(errno.EIO if reason in ("timeout", "stuck", "busy") else errno.EINVAL, detail, path)
        self.reason = reason


_counts_lock = threading.Lock()
_counts: Counter[str] = Counter()


def failures() -> dict[str, int]:
    """Refusals so far, by reason (every reason present, 0 when none happened)."""
    with _counts_lock:
        return {reason: _counts[reason] for reason in REASONS}


def _count(reason: str) -> None:
    with _counts_lock:
        _counts[reason] += 1


def _regular(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        _count("not_regular")
        raise Refused("not_regular", path, "not a regular file")


def _read_file(path: str, cap: int) -> bytes:
    """The whole file, if it is a regular one of at most ``cap`` bytes. Runs in a reader thread."""
    _regular(os.stat(path).st_mode, path)  # before opening: opening a device may start it
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        _regular(os.fstat(fd).st_mode, path)  # swapped between the stat and the open
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, cap + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                _count("too_large")
                raise Refused("too_large", path, f"longer than {cap} bytes")
    finally:
        os.close(fd)


class _Job:
    __slots__ = ("abandoned", "cap", "done", "error", "finished", "path", "result", "started")

    def __init__(self, path: str, cap: int) -> None:
        self.path = path
        self.cap = cap
        self.done = threading.Lock()
        self.done.acquire()  # released by the reader once the job has finished
        self.result = b""
        self.error: BaseException | None = None
        self.finished = False  # these two under the pool's lock
        self.abandoned = False
        self.started = time.monotonic()


class _Reader:
    """A thread that reads the files it is handed, one at a time."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._go = threading.Lock()
        self._go.acquire()
        self.job: _Job | None = None
        threading.Thread(target=self._run, name="host-read", daemon=True).start()

    def hand(self, job: _Job) -> None:
        self.job = job
        self._go.release()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            job = self.job
            if job is None:
                return
            self.job = None
            try:
                job.result = _read_file(job.path, job.cap)
            except BaseException as exc:  # handed to the caller, raised there
                job.error = exc
            if not self._pool.finished(self, job):
                return


class _Pool:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[_Reader] = []
        self.stuck: dict[str, _Job] = {}

    def read(self, path: str, cap: int, timeout: float) -> bytes:
        reader: _Reader | None = None
        with self.lock:
            if path in self.stuck:
                reason, detail = "stuck", "an earlier read of it has not returned"
            elif len(self.stuck) >= MAX_STUCK:
                reason, detail = "busy", f"{MAX_STUCK} host reads are stuck"
            else:
                reason, detail = "", ""
                reader = self.idle.pop() if self.idle else None
        if reason:
            _count(reason)
            raise Refused(reason, path, detail)
        job = _Job(path, cap)
        try:
            (reader or _Reader(self)).hand(job)
        except RuntimeError:  # no thread can be started (a pids limit reached)
            _count("busy")
            raise Refused("busy", path, "no reader thread could be started") from None
        if not job.done.acquire(timeout=timeout):
            with self.lock:
                if not job.finished:
                    job.abandoned = True
                    self.stuck[path] = job
            if job.abandoned:
                _count("timeout")
                log.warning(
                    "reading %s took over %gs: left out until that read returns (a hung bus or device?)",
                    path,
                    timeout,
                )
                raise Refused("timeout", path, f"no answer in {timeout:g}s")
            job.done.acquire()  # it finished just now
        if job.error is not None:
            raise job.error
        return job.result

    def finished(self, reader: _Reader, job: _Job) -> bool:
        """Called by ``reader`` when ``job`` is done; whether the reader waits for more work."""
        with self.lock:
            job.finished = True
            if job.abandoned and self.stuck.get(job.path) is job:
                del self.stuck[job.path]
            keep = len(self.idle) < _MAX_IDLE
            if keep:
                self.idle.append(reader)
        if job.abandoned:
            log.info("the read of %s returned after %.1fs", job.path, time.monotonic() - job.started)
        job.done.release()
        return keep


_POOL = _Pool()


def read_bytes(path: str | Path, cap: int = CAP, timeout: float | None = None) -> bytes:
    """The bytes of the regular file ``path`` (at most ``cap``, waited for at most ``timeout`` seconds,
    ``TIMEOUT`` when None); ``Refused`` or another OSError."""
    return _POOL.read(os.fspath(path), cap, TIMEOUT if timeout is None else timeout)


def read_text(path: str | Path, cap: int = CAP, timeout: float | None = None, encoding: str = "utf-8") -> str:
    """``read_bytes`` decoded, undecodable bytes replaced."""
    return read_bytes(path, cap, timeout).decode(encoding, errors="replace")


def stuck() -> int:
    """Files whose read has not returned (each holds one reader thread)."""
    with _POOL.lock:
        return len(_POOL.stuck)
