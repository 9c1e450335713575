"""The spool's clock for ages: one that a wall-clock step cannot move.

``--spool.max-age`` used to compare each batch's wall-clock stamp with the wall clock: a step of +5 days
(NTP after a boot without a real-time clock, an operator's ``date -s``) dropped batches seconds old as
5 days old, and a step back kept old ones until the clock caught up again. The spool now stamps batches
in *spool time*, milliseconds that advance only with time a step cannot fake:

- While the machine runs, spool time advances with ``CLOCK_BOOTTIME`` (it counts suspend, and neither
  NTP nor ``date -s`` moves it). An agent restart within one boot of the machine (the same
  ``/proc/sys/kernel/random/boot_id``) resumes from the state saved in the spool plus the boot-time
  elapsed since: the time the agent was down is counted exactly.
- Across a reboot ``CLOCK_BOOTTIME`` starts again from zero and nothing the agent can trust measured the
  time the machine was off: spool time resumes from the saved state plus the new boot's uptime, without
  the time off. So a wall-clock step, before, during or across a reboot, never makes a fresh batch old;
  a batch is dropped once the machine has been up ``max_age`` since it was written, so none is kept
  forever. (A node that was off for days keeps its batches for up to ``max_age`` of uptime after; the
  receiver may then refuse them as too old, counted there.)
- A spool without saved state (new, or written by an agent before this one, whose stamps are wall-clock
  time) starts spool time at the wall clock: old stamps keep their meaning, and stamps stay readable as
  dates as long as the machine is not switched off for long. Spool time never starts below the newest
  stamp in the spool, so no batch is younger than zero.

The state (boot id, boot time, spool time, wall time: a few dozen bytes) is saved in the spool at most
once a minute and when it closes; a state that does not parse is ignored (and said once).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from gpu_exporter import hostread

__all__ = ["SpoolClock", "boot_id", "boottime"]

log = logging.getLogger(__name__)

STATE_KEY = "m.clock"
_STATE_MAX = 512  # bytes: more is not a state this agent wrote
SAVE_EVERY = 60.0  # seconds of spool time between two saves


def boottime() -> float:
    """Seconds since the machine booted, suspend included; a clock no wall-clock step moves."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # not Linux: the monotonic clock, and no boot id (below)
        return time.monotonic()


def boot_id() -> str:
    """The machine's boot id (Linux), "" where there is none: every start then counts as a reboot."""
    try:
        return hostread.read_text("/proc/sys/kernel/random/boot_id", cap=64).strip()
    except OSError:
        return ""


class SpoolClock:
    def __init__(
        self,
        elapsed: Callable[[], float] = boottime,
        wall: Callable[[], float] = time.time,
        boot: Callable[[], str] = boot_id,
    ) -> None:
        self._elapsed = elapsed
        self._wall = wall
        self._boot = boot()
        # spool time = _base + elapsed(), in seconds; until a state is read, it starts at the wall clock
        self._base = wall() - elapsed()
        self._saved_at = -math.inf

    def now_ms(self) -> int:
        return int((self._base + self._elapsed()) * 1000)

    def resume(self, raw: bytes | None, newest_ms: int | None) -> str:
        """Take up the saved state (``raw``, as ``state`` wrote it; None: none) and the newest stamp in the
        spool; returns how it resumed, for the log."""
        now = self._elapsed()
        state = _parse(raw) if raw is not None else None
        if raw is not None and state is None:
            log.warning("spool: its clock state does not parse; spool time starts again at the wall clock")
        if state is None:
            start, how = self._wall(), "wall clock (no saved state)"
        elif self._boot and state["boot"] == self._boot and now >= state["elapsed"]:
            start, how = state["spool"] + (now - state["elapsed"]), "same boot: the time the agent was down counted"
        else:
            start, how = state["spool"] + now, "after a reboot: the time the machine was off not counted"
        if newest_ms is not None and start * 1000 < newest_ms:
            start = newest_ms / 1000  # never below a stamp already given: no age below zero
        self._base = start - now
        self._saved_at = -math.inf
        return how

    def due(self) -> bool:
        """Whether the state is worth saving again (once a minute)."""
        return self._elapsed() - self._saved_at >= SAVE_EVERY

    def state(self) -> bytes:
        now = self._elapsed()
        self._saved_at = now
        record = {"boot": self._boot, "elapsed": now, "spool": self._base + now, "wall": self._wall()}
        return json.dumps(record, separators=(",", ":")).encode()


def _parse(raw: bytes) -> dict[str, Any] | None:
    if len(raw) > _STATE_MAX:
        return None
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("boot"), str) or len(record["boot"]) > 64:
        return None
    for key in ("elapsed", "spool", "wall"):
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return None
    return record
