"""A process with a wrong wall clock: libfaketime preloaded into it, not the ``faketime`` wrapper.

The wrapper (``faketime -f +400d CMD``) forks CMD and waits for it without passing signals on: a
SIGTERM stops the wrapper and leaves CMD running, its clean stop never run. Preloading the library in
CMD's own environment makes the test's child the process itself, so its PID is the one signalled.
``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps the monotonic clock true: only the wall clock moves.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sysconfig

__all__ = ["faketime_env", "libfaketime"]

_NAME = "libfaketime.so.1"


def libfaketime() -> str | None:
    """The path of libfaketime.so.1 (Debian package libfaketime, pulled in by faketime), or None."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates = [f"/usr/lib/{multiarch}/faketime/{_NAME}"] if multiarch else []
    for pattern in (
        f"/usr/lib/*/faketime/{_NAME}",
        f"/usr/lib/faketime/{_NAME}",
        f"/usr/lib64/faketime/{_NAME}",
        f"/usr/local/lib/faketime/{_NAME}",
    ):
        candidates += sorted(glob.glob(pattern))
    found = next((path for path in candidates if os.path.isfile(path)), None)
    if found is not None:
        return found
    try:  # wherever the package put it
        listed = subprocess.run(["dpkg", "-L", "libfaketime"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((p for p in listed.splitlines() if p.endswith("/" + _NAME) and os.path.isfile(p)), None)


def faketime_env(env: dict[str, str], offset: str, library: str) -> dict[str, str]:
    """``env`` for a process whose wall clock is off by ``offset`` ("+400d", "-1h"; libfaketime's syntax)."""
    out = dict(env)
    preload = out.get("LD_PRELOAD", "")
    out["LD_PRELOAD"] = f"{library} {preload}".strip()
    out["FAKETIME"] = offset
    out["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
    return out
