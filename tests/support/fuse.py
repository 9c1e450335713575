"""A regular file whose ``read()`` blocks in the kernel and never returns, as over a hung I2C bus.

A FIFO is not that file: it is not regular, and hostread refuses it before reading. A sysfs attribute
behind a hung bus is a regular file whose read sleeps in the kernel; the kernel's FUSE does the same
while its server does not answer. ``HungFile`` mounts a one-file FUSE filesystem over a file (the
mount's root is the file itself) and serves it by speaking the FUSE protocol on ``/dev/fuse`` (no
libfuse): lookups, opens and attributes are answered, a READ never is. ``stop()`` closes the device,
which aborts every read still waiting (they fail with ENOTCONN), and unmounts. Needs root (mount(2)).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
import threading
import time
from pathlib import Path

__all__ = ["HungFile", "available"]

_IN = struct.Struct("<IIQQIIIHH")  # fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
_OUT = struct.Struct("<IiQ")  # fuse_out_header: len, error, unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_INIT_OUT = struct.Struct("<IIIIHHIIHHII6I")  # fuse_init_out (7.31+, 64 bytes)
_OPEN_OUT = struct.Struct("<QII")  # fuse_open_out: fh, open_flags, padding

_LOOKUP, _FORGET, _GETATTR, _OPEN, _READ, _RELEASE, _FLUSH, _INIT = 1, 2, 3, 14, 15, 18, 25, 26
_INTERRUPT, _DESTROY, _BATCH_FORGET = 36, 38, 42
_NO_REPLY = frozenset({_FORGET, _INTERRUPT, _BATCH_FORGET, _READ})  # READ: the hang itself
_FOPEN_DIRECT_IO = 1  # every read goes to the server, none is answered from the page cache
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_SIZE = 12  # what stat() says the file holds: a short number, as a sysfs attribute would


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def available() -> str:
    """ "" where a HungFile can be made here, else why not."""
    if os.geteuid() != 0:
        return "mounting a FUSE filesystem needs root"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    return ""


class HungFile:
    """``path`` (an existing regular file) replaced by one whose reads never return, until ``stop()``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reads = 0  # READ requests received (each one a read blocked in the kernel)
        self._fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        self._stop = threading.Event()
        options = f"fd={self._fd},rootmode=100444,user_id=0,group_id=0,allow_other"
        libc = _libc()
        if libc.mount(b"hung", os.fsencode(path), b"fuse", _MS_NOSUID | _MS_NODEV, options.encode()) != 0:
            code = ctypes.get_errno()
            os.close(self._fd)
            raise OSError(code, f"mount fuse on {path}: {os.strerror(code)}")
        self._thread = threading.Thread(target=self._serve, name="hung-fuse", daemon=True)
        self._thread.start()

    def __enter__(self) -> HungFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _attr(self) -> bytes:
        now = int(time.time())
        return _ATTR.pack(1, _SIZE, 1, now, now, now, 0, 0, 0, 0o100444, 1, 0, 0, 0, 4096, 0)

    def _reply(self, unique: int, body: bytes = b"", error: int = 0) -> None:
        try:
            os.write(self._fd, _OUT.pack(_OUT.size + len(body), -error, unique) + body)
        except OSError:
            pass  # the request was interrupted meanwhile

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if not ready:
                continue
            try:
                request = os.read(self._fd, 1 << 17)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue
                return  # ENODEV: unmounted
            _, opcode, unique, _, _, _, _, _, _ = _IN.unpack_from(request)
            if opcode == _READ:
                self.reads += 1
            if opcode in _NO_REPLY:
                continue
            if opcode == _INIT:
                _, minor = struct.unpack_from("<II", request, _IN.size)
                body = _INIT_OUT.pack(7, min(minor, 31), 0, 0, 1, 1, 1 << 16, 1, 1, 0, 0, 0, *([0] * 6))
                self._reply(unique, body)
            elif opcode == _GETATTR:
                self._reply(unique, struct.pack("<QII", 1, 0, 0) + self._attr())
            elif opcode == _OPEN:
                self._reply(unique, _OPEN_OUT.pack(1, _FOPEN_DIRECT_IO, 0))
            elif opcode in (_RELEASE, _FLUSH, _DESTROY):
                self._reply(unique)
            elif opcode == _LOOKUP:
                self._reply(unique, error=errno.ENOENT)
            else:
                self._reply(unique, error=errno.ENOSYS)

    def stop(self) -> None:
        """Abort the reads still waiting (closing the device ends the connection) and unmount."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5)
        os.close(self._fd)
        _libc().umount2(os.fsencode(self.path), _MNT_DETACH)
