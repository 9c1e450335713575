"""What the bridge wrote, kept in a file, so that a restarted bridge recognises what its predecessor
wrote and had not had acknowledged.

The bridge acknowledges a message only after its samples were written. A bridge killed in between (SIGKILL,
OOM) leaves those messages unacknowledged in its MQTT session, and the broker delivers them again to
the restarted bridge, whose replay memory (``dedup.SeqTracker``) starts empty: without this record it
would write them a second time, and a TSDB that keeps exact duplicates (VictoriaMetrics without
``-dedup.minScrapeInterval``) would store them twice.

After each successful write, and before the acknowledgements, the writer appends one line per write:
the (node, stream, ranges of sequence numbers) it wrote. A line is in the kernel's page cache once
``os.write`` returns, so it outlives the process however it ends (a machine that dies takes the
bridge's session with it anyway, where the file lives in an emptyDir). On start the bridge reads the
record into its replay memory. Only the last writes matter (a bridge holds at most
``--bridge.max-inflight`` messages unacknowledged), so the file is bounded: past ``max_bytes`` it becomes
``<path>.1`` (replacing the one before) and a new one starts; both are read on start.

A write the bridge was killed during (the request sent, the answer not yet read) is not recorded: its
messages are written again. A TSDB that ignores an exact duplicate (Prometheus, Mimir, Thanos Receive,
VictoriaMetrics with ``-dedup.minScrapeInterval``) stores each sample once all the same.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from gpu_exporter.bridge.dedup import SeqTracker

__all__ = ["WriteJournal", "seq_ranges"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 * 1024 * 1024

# One write's record: (node, stream, [(lo, hi), ...]) per batch written.
Marks = list[tuple[str, str, list[tuple[int, int]]]]


def seq_ranges(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending sequence numbers as closed ranges of consecutive ones."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


class WriteJournal:
    """The record of written sequence numbers in ``path`` (and ``path``.1). Used by the writer thread only."""

    def __init__(self, path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self._fd = -1
        self._size = 0
        self.skipped = 0  # lines that could not be read (a line cut short by the kill)

    def load(self, tracker: SeqTracker) -> int:
        """Mark what the files record as written in ``tracker``; the ranges loaded."""
        loaded = 0
        for part in (self.path.with_name(self.path.name + ".1"), self.path):
            try:
                text = part.read_bytes()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                try:
                    for node, stream, ranges in json.loads(line):
                        tracker.mark(str(node), str(stream), list(_expand(ranges)))
                        loaded += len(ranges)
                except (ValueError, TypeError):
                    self.skipped += 1
        if self.skipped:
            log.warning("write journal %s: %d unreadable line(s) skipped", self.path, self.skipped)
        return loaded

    def record(self, marks: Marks) -> None:
        """Append one write's marks (before its messages are acknowledged)."""
        if not marks:
            return
        line = json.dumps(marks, separators=(",", ":")).encode() + b"\n"
        if self._fd < 0:
            self.open()
        elif self._size + len(line) > self.max_bytes:
            os.close(self._fd)
            self._fd = -1
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self.open()
        os.write(self._fd, line)
        self._size += len(line)

    def open(self) -> None:
        """Open (create) the file for appending; OSError when it cannot be."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._size = os.fstat(self._fd).st_size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _expand(ranges: list[list[int]]) -> Iterable[int]:
    for lo, hi in ranges:
        if not (isinstance(lo, int) and isinstance(hi, int)) or hi < lo or hi - lo > 1_000_000:
            raise ValueError("bad range")
        yield from range(lo, hi + 1)
