"""Mutation check: plant realistic bugs one at a time and see whether the tests notice.

Each mutant replaces one exact snippet of source with a buggy version, in a temporary copy of the tree
(every file git knows of), so the working tree is never changed, even when interrupted.
For each mutant only the test files that cover the code run (``pytest -x -q``, with a timeout); a
mutant is *killed* when they fail and *survives* when they pass. A snippet that is not found exactly once
stops the run before anything is tested: the tool cannot rot silently when the code changes.

Usage: python tools/mutate.py [--only NAME ...] [--timeout SECONDS] [--list]
Exit status: 0 when every mutant was killed, 1 when any survived, 2 when a snippet is missing or the
unmutated tests fail. It takes a few minutes; it is not part of .ci/run (docs/testing.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # test files, or file::test node ids
    why: str  # the bug, as a reviewer would describe it
    area: str = ""


def _area(area: str, *mutants: Mutant) -> tuple[Mutant, ...]:
    return tuple(dataclasses.replace(m, area=area) for m in mutants)


# Mutants by area. Each names the narrowest tests that cover it (a file, or a file::test node id), so that
# the whole run stays within minutes. Snippets are core lines that change rarely; a snippet that moved
# stops the run before anything is tested (see check_snippets).
MUTANTS: tuple[Mutant, ...] = (
    *_area(
        "codec",
        Mutant(
            "codec-untyped-seq",
            "src/gpu_exporter/payload/document.py",
            '    if not isinstance(value, list):\n        raise PayloadError(f"{where} must be an array, not {_jtype(value)}")\n'
            "    out: list[int] = []\n",
            "    out: list[int] = []\n",
            ("tests/unit/payload/test_forward_batch.py",),
            "seq/time_ms not checked to be arrays: a number there raises TypeError inside the decoder",
        ),
        Mutant(
            "codec-second-order",
            "src/gpu_exporter/payload/document.py",
            "        deltas = deltas[:1] + list(itertools.accumulate(deltas[1:]))\n",
            "        deltas = list(itertools.accumulate(deltas))\n",
            ("tests/unit/payload/test_forward_batch.py",),
            "second-order deltas undone from the wrong start: smooth columns decode to wrong values",
        ),
        Mutant(
            "codec-reference-sign",
            "src/gpu_exporter/payload/encode.py",
            '        if sign < 0:\n            ref["sign"] = -1\n',
            "",
            ("tests/unit/payload/test_forward_batch.py",),
            "a column moving against an earlier one (memory free vs used) is encoded as moving with it",
        ),
        Mutant(
            "codec-up-fast-path-trusted",
            "src/gpu_exporter/payload/document.py",
            "    if not (set(map(type, up)) <= _UP_TYPES and set(up) <= _UP_VALUES):  # the usual case, checked in C\n",
            "    if False:\n",
            ("tests/unit/payload/test_forward_batch.py",),
            "a device's up entries are not checked: 2 or true reads as up, on both the agent's and the bridge's side",
        ),
        Mutant(
            "columns-empty-array",
            "src/gpu_exporter/payload/columns.py",
            "            form = col[0] if col else -1\n",
            "            form = col[0]\n",
            ("tests/unit/payload/test_bridge_columns.py", "tests/unit/bridge/test_bridge_fuzz.py"),
            "an empty array column raises IndexError in the reader instead of a refusal",
        ),
        Mutant(
            "columns-second-order",
            "src/gpu_exporter/payload/deltas.py",
            "                deltas[1:] = itertools.accumulate(deltas[1:])\n",
            "                deltas[:] = itertools.accumulate(deltas)\n",
            ("tests/unit/payload/test_bridge_columns.py",),
            "the fast path undoes second-order deltas wrongly: the bridge writes wrong values",
        ),
    ),
    *_area(
        "spool",
        Mutant(
            "spool-caps-drop-inflight",
            "src/gpu_exporter/forward/spool.py",
            "            if (entry == keep and len(self._index) > 1) or entry.key in self.pinned:\n",
            "            if entry == keep and len(self._index) > 1:\n",
            ("tests/unit/forward/test_forward_spool.py",),
            "the byte cap drops a batch the broker is acknowledging: counted as lost and as delivered",
        ),
        Mutant(
            "spool-log-every-refusal",
            "src/gpu_exporter/forward/spool_faults.py",
            "        if not self._refusing or now - self._logged_at >= LOG_EVERY:\n",
            "        if True:\n",
            ("tests/unit/forward/test_forward_spool.py",),
            "a full disk logs one line per refused batch instead of one",
        ),
    ),
    *_area(
        "forwarder",
        Mutant(
            "forwarder-refusal-as-ack",
            "src/gpu_exporter/forward/sender.py",
            '        if not ok:\n            self._refusal(reason, f"batch {entry.first_seq}-{entry.last_seq}")\n',
            '        if False:\n            self._refusal(reason, f"batch {entry.first_seq}-{entry.last_seq}")\n',
            ("tests/integration/test_forward_paths.py",),
            "a batch the broker refused is deleted from the spool as if acknowledged",
        ),
        Mutant(
            "forwarder-replay-burst",
            "src/gpu_exporter/forward/sender.py",
            "        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)\n",
            "        self._tokens = self._tokens + (now - self._tokens_at) * rate\n",
            ("tests/integration/test_forward_paths.py",),
            "after a pause the replay rate's tokens pile up: the backlog goes out in one burst",
        ),
        Mutant(
            "forwarder-keeps-corrupt-journal",
            "src/gpu_exporter/forward/service.py",
            "                self.spool.forget_journal([key])\n",
            "",
            ("tests/integration/test_forward_paths.py",),
            "a corrupt journal entry stays in the spool and is counted again at every start",
        ),
        Mutant(
            "forwarder-batch-one-late",
            "src/gpu_exporter/forward/service.py",
            "        if len(b.samples) >= self.config.mqtt_batch_max_samples:\n",
            "        if len(b.samples) > self.config.mqtt_batch_max_samples:\n",
            ("tests/integration/test_forward_paths.py",),
            "a batch closes one sample after --mqtt.batch-max-samples",
        ),
        # the six kinds of change that close the open batch at once (an alert waits for them): the
        # catalog's event flag, which forward/summary.py's EVENT_COUNTERS (service.py's EVENT_KEYS) reads
        *(
            Mutant(
                f"forwarder-event-{key}",
                f"src/gpu_exporter/catalog/{module}",
                f"{context}{' ' * indent}event=True,\n",
                context,
                ("tests/unit/forward/test_batch_events.py",),
                f"a change of {key} no longer closes the batch at once: its alert waits for the batch interval",
            )
            for key, module, context, indent in (
                ("xid_errors", "extended.py", '        labels=("xid",),\n', 8),
                ("ecc_uncorrected_volatile", "extended.py", '            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",\n', 12),
                ("ecc_uncorrected_aggregate", "extended.py", '            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",\n', 12),
                (
                    "ecc_block_uncorrected",
                    "vendors.py",
                    '        {"type": "uncorrected"},\n        labels=("block",),\n',
                    8,
                ),
                (
                    "remapped_rows_uncorrectable",
                    "extended.py",
                    '            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",\n',
                    12,
                ),
                ("remapped_rows_failure", "extended.py", '        dcgm="DCGM_FI_DEV_ROW_REMAP_FAILURE",\n', 8),
            )
        ),
    ),
    *_area(
        "summaries",
        Mutant(
            "summary-max-is-last",
            "src/gpu_exporter/forward/summary.py",
            '                out[(f"{key}:max", labels)] = _short(st.high, digits)\n',
            '                out[(f"{key}:max", labels)] = _short(st.last, digits)\n',
            ("tests/unit/forward/test_forward_summary.py",),
            "a summary's max is the window's last value: a spike inside the window is lost",
        ),
        Mutant(
            "link-meter-counts-latency",
            "src/gpu_exporter/forward/link_meter.py",
            "            busy -= min(latency, rtt)\n",
            "            busy -= 0.0\n",
            ("tests/unit/forward/test_forward_summary.py",),
            "a batch sent alone counts the round trip as transfer time: a far but fast link looks weak",
        ),
        Mutant(
            "adaptive-raw-ahead-of-summaries",
            "src/gpu_exporter/forward/adaptive.py",
            "        return bool(rate) and (self.meter.inflight_bytes() + size) / rate <= 0.8 * until_next\n",
            "        return True\n",
            ("tests/unit/forward/test_forward_summary.py",),
            "on a weak link full-resolution batches fill the link and the next summary waits behind them",
        ),
        Mutant(
            "adaptive-quiet-keeps-judgement",
            "src/gpu_exporter/forward/adaptive.py",
            "        if self.active and not (connected and self.meter.weak(headroom=LEAVE)):\n            self._end()\n",
            "",
            ("tests/unit/forward/test_forward_need.py",),
            "a weak judgement made during a burst stands until the next sample: no raw batch goes on an idle link",
        ),
        Mutant(
            "forwarder-never-quiet",
            "src/gpu_exporter/forward/service.py",
            "        elif not self._open.samples and now - self._open.opened >= self._span():\n            self._idle(now)\n",
            "",
            (
                "tests/integration/test_forward_limits.py::"
                "test_a_sample_over_the_maximum_is_cut_by_device_and_only_a_series_that_cannot_fit_is_dropped",
            ),
            "no batch interval without samples judges the link again: after a burst, summaries for good",
        ),
        Mutant(
            "forwarder-count-closed-timed-from-first-sample",
            "src/gpu_exporter/forward/service.py",
            "            span = max(span, now - self._measured)\n",
            "            pass\n",
            ("tests/unit/forward/test_forward_need.py",),
            "a batch closed by its sample count is timed from when it was taken: a healthy link reads as thin",
        ),
        Mutant(
            "summary-window-ignores-the-link",
            "src/gpu_exporter/forward/adaptive.py",
            "        if span < self.interval or self._pending is not None or self._fresh or self._delivery is not None:\n",
            "        if span < self.interval:\n",
            ("tests/unit/forward/test_summary_window.py", "tests/unit/forward/test_forward_summary.py"),
            "a window closes every interval while the link still carries the last summary: they queue, the cloud falls behind",
        ),
        Mutant(
            "summary-window-never-narrows",
            "src/gpu_exporter/forward/adaptive.py",
            "        span = window.last.timestamp - self._start\n        if span < self.interval",
            "        span = window.last.timestamp - self._start\n        if span < max(self.interval, self.window_s)",
            ("tests/unit/forward/test_summary_window.py",),
            "once widened, the summary window stays wide after the link recovers",
        ),
        Mutant(
            "summary-merge-mean-unweighted",
            "src/gpu_exporter/forward/summary.py",
            "            mean = math.fsum(r[2] * r[3] for r in rows) / (sum(r[3] for r in rows) or 1.0)\n",
            "            mean = math.fsum(r[2] for r in rows) / len(rows)\n",
            (
                "tests/unit/forward/test_forward_summary.py::test_merged_windows_keep_the_extremes_and_weigh_the_means_by_window",
            ),
            "merged backlog windows average their means without weighing them by window length",
        ),
        Mutant(
            "bridge-summary-counter-filled",
            "src/gpu_exporter/bridge/summaries.py",
            '        if stat != "last" or not _gauge(base):\n',
            '        if stat != "last":\n',
            ("tests/unit/forward/test_forward_summary.py", "tests/integration/test_bridge_summaries.py"),
            "the bridge writes a counter's last value as its min, max and mean too: _max series of counters appear",
        ),
    ),
    *_area(
        "bridge",
        Mutant(
            "sender-ignores-retry-after",
            "src/gpu_exporter/bridge/sender.py",
            "            wait = max(delay, retry_after or 0.0)\n",
            "            wait = delay\n",
            ("tests/integration/test_bridge_sender.py", "tests/unit/bridge/test_bridge_paths.py"),
            "a 429's Retry-After is ignored: the bridge hammers a receiver that asked it to wait",
        ),
        Mutant(
            "sender-uncapped-wait",
            "src/gpu_exporter/bridge/sender.py",
            "            wait = min(wait, self._backoff_max) * random.uniform(0.8, 1.0)\n",
            "            wait = wait * random.uniform(0.8, 1.0)\n",
            ("tests/unit/bridge/test_bridge_paths.py",),
            "a receiver's Retry-After of an hour stalls the whole fleet's stream past --remote-write.max-backoff",
        ),
        Mutant(
            "sender-condemns-older-half",
            "src/gpu_exporter/bridge/sender.py",
            "        if verdict.ordered and newer_all_refused:\n",
            "        if verdict.ordered:\n",
            ("tests/integration/test_bridge_sender.py",),
            "after a 'too old' refusal the older half is dropped even though the newer half was written",
        ),
        Mutant(
            "bridge-fresh-as-replay",
            "src/gpu_exporter/bridge/service.py",
            "if seqs[i] not in taken]\n",
            "if seqs[i] in taken]\n",
            ("tests/unit/bridge/test_bridge_fuzz.py",),
            "every fresh sample is taken for a replay and never written",
        ),
        Mutant(
            "bridge-summary-as-raw-replay",
            "src/gpu_exporter/bridge/service.py",
            '    stream = batch.boot + "/summary" if batch.summary_ms else batch.boot\n',
            "    stream = batch.boot\n",
            ("tests/integration/test_bridge_summaries.py",),
            "summaries share the raw samples' replay memory: the full resolution that follows them is dropped",
        ),
        Mutant(
            "bridge-marks-before-write",
            "src/gpu_exporter/bridge/service.py",
            "        outcome = self._writer.write(converted.series)\n"
            "        now = time.time()\n"
            "        for batch, keep in decoded:\n"
            "            self.dedup.mark(batch.node, _stream(batch), batch.seqs if keep is None else [batch.seqs[i] for i in keep])\n",
            "        for batch, keep in decoded:\n"
            "            self.dedup.mark(batch.node, _stream(batch), batch.seqs if keep is None else [batch.seqs[i] for i in keep])\n"
            "        outcome = self._writer.write(converted.series)\n"
            "        now = time.time()\n",
            (
                "tests/unit/bridge/test_bridge_replays.py::test_a_write_that_failed_does_not_count_its_samples_as_written",
            ),
            "a message is marked as written before its remote write: after a failed write the one-by-one retry "
            "takes every sample for a replay (72 samples -> 0)",
        ),
        Mutant(
            "bridge-linger-restarts",
            "src/gpu_exporter/bridge/service.py",
            "                msgs.append(self._queue.get(timeout=min(left, 0.2)))\n",
            "                msgs.append(self._queue.get(timeout=min(left, 0.2)))\n"
            "                deadline = time.monotonic() + self.settings.linger\n",
            (
                "tests/integration/test_bridge_fleet.py::test_a_steady_stream_is_written_every_linger_not_held_until_it_stops",
            ),
            "the linger starts again with each message: a steady stream is held until it pauses",
        ),
        Mutant(
            "bridge-no-linger",
            "src/gpu_exporter/bridge/service.py",
            "        deadline = time.monotonic() + self.settings.linger\n",
            "        deadline = time.monotonic()\n",
            (
                "tests/integration/test_bridge_fleet.py::"
                "test_messages_arriving_one_at_a_time_within_the_linger_are_written_together",
            ),
            "--bridge.write-linger ignored: one remote write per message of a fleet",
        ),
        Mutant(
            "bridge-journal-not-read",
            "src/gpu_exporter/bridge/service.py",
            "        loaded = journal.load(self.dedup)\n",
            "        loaded = 0\n",
            (
                "tests/integration/test_bridge_fleet.py::"
                "test_a_bridge_killed_before_its_acknowledgements_arrived_writes_nothing_twice_after_its_restart",
            ),
            "a restarted bridge forgets what it wrote: what its session delivers again is written twice",
        ),
        Mutant(
            "bridge-recipe-percent-unescaped",
            "src/gpu_exporter/bridge/convert.py",
            'p.replace(b"%", b"%%")',
            "p",
            (
                "tests/integration/test_bridge_fleet.py::"
                "test_labels_composed_from_shared_recipes_are_exactly_the_series_labels_even_with_percent_signs",
            ),
            "a '%' in a label value (or a 37-byte field) breaks the composed labels",
        ),
        Mutant(
            "bridge-ack-before-write",
            "src/gpu_exporter/bridge/service.py",
            "        outcome = self._writer.write(converted.series)\n",
            "        self._acknowledge(taken_msgs)\n        outcome = self._writer.write(converted.series)\n",
            (
                "tests/integration/test_bridge_service.py::test_each_write_group_is_acknowledged_after_its_write_and_no_other",
            ),
            "a group's messages acknowledged before its remote write: a write that fails or a bridge that dies "
            "loses them (the broker no longer holds them)",
        ),
        Mutant(
            "bridge-ack-whole-take",
            "src/gpu_exporter/bridge/service.py",
            "            self._acknowledge(taken)\n",
            "            self._acknowledge(msgs)\n",
            (
                "tests/integration/test_bridge_service.py::test_each_write_group_is_acknowledged_after_its_write_and_no_other",
            ),
            "the first group's write acknowledges every message taken at once, also those of groups not written yet",
        ),
        Mutant(
            "bridge-ack-after-last-group",
            "src/gpu_exporter/bridge/service.py",
            "            self._acknowledge(taken)\n",
            "",
            (
                "tests/integration/test_bridge_service.py::test_each_write_group_is_acknowledged_after_its_write_and_no_other",
            ),
            "a group's messages acknowledged only after every group of the take was written: a bridge that dies "
            "between writes gets written messages again",
        ),
        Mutant(
            "bridge-keeps-pre-1970",
            "src/gpu_exporter/bridge/clock.py",
            "        kept = [i for i in positions if 0 <= times[i] <= now_ms]\n",
            "        kept = [i for i in positions if times[i] <= now_ms]\n",
            ("tests/unit/bridge/test_bridge_timestamps.py",),
            "samples stamped before 1970 are counted as refused but written all the same",
        ),
        Mutant(
            "bridge-correction-rounded-to-nearest",
            "src/gpu_exporter/bridge/clock.py",
            "                offset = math.ceil(skew / 1000) * 1000\n",
            "                offset = round(skew / 1000) * 1000\n",
            (
                "tests/unit/bridge/test_bridge_timestamps.py::"
                "test_a_lead_of_a_fraction_of_a_second_is_corrected_by_whole_seconds_up_never_into_the_future",
            ),
            "a skewed node's correction is rounded to the nearest second: its newest samples can land in the future",
        ),
        Mutant(
            "bridge-skew-ignores-broker-hold",
            "src/gpu_exporter/bridge/clock.py",
            "        held_ms = (sendtime.EXPIRY_S - remaining) * 1000\n",
            "        held_ms = 0\n",
            ("tests/unit/bridge/test_bridge_trust.py",),
            "a batch the broker held for minutes makes its node look minutes behind: healthy nodes get corrected",
        ),
    ),
    *_area(
        "dedup",
        Mutant(
            "dedup-trim-keeps-oldest",
            "src/gpu_exporter/bridge/dedup.py",
            "            del self.los[: len(self.los) - max_ranges]\n            del self.his[: len(self.his) - max_ranges]\n",
            "            del self.los[max_ranges:]\n            del self.his[max_ranges:]\n",
            (
                "tests/unit/bridge/test_bridge_replays.py::test_a_recent_replay_is_written_once_however_many_gaps_came_before",
            ),
            "over the range cap the newest ranges are dropped: a recent replay is written twice",
        ),
        Mutant(
            "dedup-touching-ranges-kept-apart",
            "src/gpu_exporter/bridge/dedup.py",
            "        i = bisect.bisect_left(self.his, lo - 1)  # first range that could touch\n",
            "        i = bisect.bisect_left(self.his, lo)  # first range that could touch\n",
            (
                "tests/unit/bridge/test_bridge_replays.py::test_consecutive_batches_are_one_range_so_nothing_of_a_long_run_is_forgotten",
            ),
            "consecutive batches stay separate ranges: a steady node fills the range cap and old replays are rewritten",
        ),
        Mutant(
            "dedup-fifo-not-lru",
            "src/gpu_exporter/bridge/dedup.py",
            "            else:\n                self._streams.move_to_end(key)\n",
            "            else:\n                pass\n",
            (
                "tests/unit/bridge/test_bridge_replays.py::test_a_busy_node_keeps_its_replay_memory_while_idle_nodes_are_forgotten_first",
            ),
            "the stream cap forgets the oldest node, not the least recently written: a busy node's replays are rewritten",
        ),
        Mutant(
            "dedup-range-end-unseen",
            "src/gpu_exporter/bridge/dedup.py",
            "        return i >= 0 and seq <= self.his[i]\n",
            "        return i >= 0 and seq < self.his[i]\n",
            (
                "tests/unit/bridge/test_bridge_replays.py::test_consecutive_batches_are_one_range_so_nothing_of_a_long_run_is_forgotten",
            ),
            "the last sample of every written range is not recognised as a replay",
        ),
    ),
    *_area(
        "web",
        Mutant(
            "web-evicts-newest",
            "src/gpu_exporter/web/server.py",
            "            return min(waiting, key=lambda c: (not c.refused, c.since))\n",
            "            return min(waiting, key=lambda c: (not c.refused, -c.since))\n",
            (
                "tests/unit/web/test_web_rules.py::test_at_the_cap_the_connection_waiting_longest_makes_room_not_the_newest",
            ),
            "at the connection cap the newest waiting connection is closed instead of the oldest",
        ),
        Mutant(
            "web-gzip-wildcard-beats-refusal",
            "src/gpu_exporter/web/server.py",
            "    chosen = best if best is not None else star\n",
            "    chosen = best or star\n",
            (
                "tests/unit/web/test_web_rules.py::test_accept_encoding_a_named_gzip_beats_the_wildcard",
                "tests/unit/web/test_web_rules.py::test_gzip_refused_by_name_is_not_sent_whatever_the_wildcard_says",
            ),
            "Accept-Encoding 'gzip;q=0, *' is answered with gzip",
        ),
        Mutant(
            "web-probes-need-credentials",
            "src/gpu_exporter/web/server.py",
            "        if path not in OPEN_PATHS and not self._admitted(srv):\n",
            "        if not self._admitted(srv):\n",
            ("tests/unit/web/test_web_tls.py::test_https_with_basic_auth_right_wrong_and_missing",),
            "with basic auth on, /healthz and /readyz want credentials: the kubelet's probes fail",
        ),
        Mutant(
            "web-body-read-as-request",
            "src/gpu_exporter/web/server.py",
            "            self.close_connection = True  # never read a body as the next request\n",
            "            pass  # never read a body as the next request\n",
            ("tests/unit/web/test_web_limits.py::test_a_request_body_is_not_read_as_a_further_request",),
            "a request body is read as a further request (request smuggling past the auth of the first)",
        ),
        Mutant(
            "web-sweep-spares-answering",
            "src/gpu_exporter/web/server.py",
            "            late = [c for c in self._conns.values() if c.deadline < now]\n",
            "            late = [c for c in self._conns.values() if c.waiting and c.deadline < now]\n",
            ("tests/unit/web/test_web_rules.py::test_clients_that_stop_reading_their_answer_lose_their_slots",),
            "a client that stops reading its answer holds a connection slot (and a thread) for ever",
        ),
    ),
    *_area(
        "auth",
        Mutant(
            "auth-password-colon",
            "src/gpu_exporter/web/auth.py",
            '    user, sep, password = decoded.partition(b":")\n',
            '    user, sep, password = decoded.rpartition(b":")\n',
            (
                "tests/unit/web/test_web_rules.py::test_a_password_with_colons_is_accepted_and_only_the_first_colon_ends_the_user",
            ),
            "a basic-auth password containing ':' is refused",
        ),
        Mutant(
            "auth-cache-ignores-password",
            "src/gpu_exporter/web/auth.py",
            '        msg = b"%d:%d:%d:" % (known, len(user), len(hashed)) + user + hashed + password\n',
            '        msg = b"%d:%d:%d:" % (known, len(user), len(hashed)) + user + hashed\n',
            ("tests/unit/web/test_web_tls.py::test_a_checked_pair_is_remembered_right_or_wrong",),
            "after one good login the user's credentials are cached by name: any password passes",
        ),
        Mutant(
            "auth-scheme-case-sensitive",
            "src/gpu_exporter/web/auth.py",
            '    if not authorization or authorization[:6].lower() != "basic ":\n',
            '    if not authorization or authorization[:6] != "Basic ":\n',
            ("tests/unit/web/test_web_rules.py::test_the_auth_scheme_is_case_insensitive",),
            "an Authorization header with the scheme in lower case ('basic ...') is refused",
        ),
    ),
    *_area(
        "health",
        Mutant(
            "health-warning-xid-overwrites-failure",
            "src/gpu_exporter/backends/health.py",
            "                level = max(level, WARNING)\n",
            "                level = WARNING\n",
            ("tests/unit/backends/test_health_levels.py",),
            "a warning XID after a failure XID turns gpu_health{subsystem=xid} from failure to warning",
        ),
        Mutant(
            "health-repeated-xid-not-renewed",
            "src/gpu_exporter/backends/health.py",
            "            if count > state.xid_counts.get(code, 0.0) and code.isdigit():\n",
            "            if count > 0 and code not in state.xid_counts and code.isdigit():\n",
            ("tests/unit/backends/test_health_levels.py",),
            "an XID that happens again does not renew its hour: the GPU looks healthy while it keeps failing",
        ),
        Mutant(
            "health-counter-reset-as-burst",
            "src/gpu_exporter/backends/health.py",
            "                        rates[key] = max(0.0, value - old[key]) / span\n",
            "                        rates[key] = abs(value - old[key]) / span\n",
            ("tests/unit/backends/test_health_levels.py",),
            "a counter reset (driver reload) reads as a burst of PCIe replays or throttling",
        ),
        Mutant(
            "health-retired-pages-off-by-one",
            "src/gpu_exporter/backends/health.py",
            '    if present.get("remapped_rows_failure", 0.0) > 0 or retired >= RETIRED_PAGES_FAILURE:\n',
            '    if present.get("remapped_rows_failure", 0.0) > 0 or retired > RETIRED_PAGES_FAILURE:\n',
            ("tests/unit/backends/test_health_levels.py",),
            "memory health fails one retired page later than documented",
        ),
        Mutant(
            "backend-asks-lost-gpu",
            "src/gpu_exporter/backends/_calls.py",
            "        if not live.up and now < live.retry_at:\n",
            "        if False:\n",
            ("tests/unit/backends/nvidia/test_nvml_backend.py",),
            "a lost GPU is asked every cycle during its backoff (each call can hang for seconds)",
        ),
    ),
    *_area(
        "vendor tables",
        Mutant(
            "amd-power-cap-in-milliwatts",
            "src/gpu_exporter/backends/amd/backend.py",
            '    Simple("power_limit", "amdsmi_get_power_cap_info", field="power_cap", scale=1e-6),  # µW\n',
            '    Simple("power_limit", "amdsmi_get_power_cap_info", field="power_cap", scale=1e-3),  # µW\n',
            ("tests/unit/backends/amd/test_amd.py",),
            "AMD's power cap (microwatts) read as milliwatts: gpu_power_limit_watts is 1,000 times too high",
        ),
        Mutant(
            "jetson-garbled-load-uncounted",
            "src/gpu_exporter/backends/jetson/backend.py",
            '    Simple("utilization", "load", ("gpu", "load"), divide=1000, low=0, high=1000, strict=True),\n',
            '    Simple("utilization", "load", ("gpu", "load"), divide=1000, low=0, high=1000),\n',
            ("tests/unit/backends/jetson/test_jetson.py",),
            "a Jetson load file out of 0-1000 (garbled) is dropped without counting an error",
        ),
        Mutant(
            "nvidia-pcie-throughput-in-kib",
            "src/gpu_exporter/backends/nvidia/backend.py",
            '    Simple("pcie_tx", "nvmlDeviceGetPcieThroughput", (0,), scale=1024.0),  # NVML_PCIE_UTIL_TX_BYTES, in KB/s\n',
            '    Simple("pcie_tx", "nvmlDeviceGetPcieThroughput", (0,)),  # NVML_PCIE_UTIL_TX_BYTES, in KB/s\n',
            ("tests/unit/backends/nvidia/test_nvml_backend.py",),
            "NVML's PCIe throughput (KB/s) served as bytes per second: 1,024 times too low",
        ),
        Mutant(
            "nvidia-late-answer-fills-one-row",
            "src/gpu_exporter/backends/nvidia/backend.py",
            "                sharing = tuple(r for r in rows if r.ident == row.ident)  # every row that reads this answer\n",
            "                sharing = (row,)  # every row that reads this answer\n",
            (
                "tests/unit/backends/nvidia/test_slow_calls.py::"
                "test_every_row_of_a_slow_answer_still_running_is_filled_in_at_the_end_of_the_cycle",
            ),
            "a slow utilization call still running at its turn fills utilization only: memory utilization goes missing",
        ),
        Mutant(
            "simple-call-per-row",
            "src/gpu_exporter/backends/simple.py",
            "        if ident not in answers:\n",
            "        if True:\n",
            ("tests/unit/backends/test_backend_simple.py",),
            "rows that read fields of one answer call the library once each (pcie_info four times a cycle)",
        ),
        Mutant(
            "simple-wrong-shape-uncounted",
            "src/gpu_exporter/backends/simple.py",
            "    except _WrongShape:\n        errors[row.call] += 1\n        return True\n",
            "    except _WrongShape:\n        return True\n",
            ("tests/unit/backends/test_backend_simple.py",),
            "an answer of the wrong shape is dropped without counting an error: a broken library goes unseen",
        ),
    ),
    *_area(
        "k8s",
        Mutant(
            "k8s-old-mig-id-ignores-compute-instance",
            "src/gpu_exporter/k8s/podresources.py",
            '        return parent == device.parent_uuid and rest == f"{device.gpu_instance}/{device.compute_instance}"\n',
            '        return parent == device.parent_uuid and rest.split("/")[0] == device.gpu_instance\n',
            ("tests/unit/k8s/test_k8s_identity.py",),
            "MIG-GPU-<uuid>/<gi>/<ci> matches every compute instance of the GPU instance: pods share each other's series",
        ),
        Mutant(
            "k8s-replica-suffix-kept",
            "src/gpu_exporter/k8s/podresources.py",
            '    base = device_id.split("::", 1)[0]  # time-slicing replica <id>::<n>\n',
            "    base = device_id  # time-slicing replica <id>::<n>\n",
            ("tests/unit/k8s/test_k8s_sources.py::test_device_ids_match_gpus_mig_instances_and_replicas",),
            "time-slicing replicas (GPU-x::1) match no GPU: pods sharing a GPU are not named",
        ),
        Mutant(
            "jetson-returning-pid-skipped",
            "src/gpu_exporter/backends/jetson/procs.py",
            "        self._quiet = quiet  # exited PIDs drop out\n",
            "        self._quiet.update(quiet)  # exited PIDs drop out\n",
            ("tests/unit/k8s/test_k8s_identity.py::test_a_jetson_pid_that_comes_back_holding_the_gpu_is_seen_at_once",),
            "a Jetson PID that exits and comes back as a GPU process is skipped as the old quiet one",
        ),
        Mutant(
            "k8s-pid-cache-outlives-process",
            "src/gpu_exporter/k8s/attribution.py",
            "            del self._pids[pid]  # exited: its PID may be reused by another pod's process\n",
            "            pass  # exited: its PID may be reused by another pod's process\n",
            ("tests/unit/k8s/test_k8s_pid_reuse.py",),
            "a reused PID keeps the pod of the process that had it before",
        ),
        Mutant(
            "k8s-energy-counter-reset-negative",
            "src/gpu_exporter/k8s/energy.py",
            "        if energy is not None and previous_energy is not None and energy >= previous_energy:\n",
            "        if energy is not None and previous_energy is not None:\n",
            ("tests/unit/k8s/test_k8s_energy.py",),
            "an energy counter that resets (driver reload) gives the interval no energy instead of power x time",
        ),
    ),
    *_area(
        "config",
        Mutant(
            "config-durations-lose-lower-bound",
            "src/gpu_exporter/config/parsers.py",
            "        if not low <= seconds <= high:\n",
            "        if seconds > high:\n",
            ("tests/unit/config/test_config_bounds.py",),
            "--spool.max-age=0s and --mqtt.keepalive=0s are accepted",
        ),
        Mutant(
            "config-bridge-durations-lose-lower-bound",
            "src/gpu_exporter/config/parsers.py",
            '        if seconds < low:\n            raise ValueError(f"{text!r} is below the {low:g}s minimum")\n',
            '        if seconds < 0:\n            raise ValueError(f"{text!r} is below the {low:g}s minimum")\n',
            ("tests/unit/config/test_config_bounds.py",),
            "--bridge.max-clock-skew=0s and --remote-write.timeout=0s are accepted",
        ),
        Mutant(
            "config-counts-lose-lower-bound",
            "src/gpu_exporter/config/parsers.py",
            "        if value < low:\n",
            "        if value < 0:\n",
            ("tests/unit/config/test_config.py",),
            "--metrics-buffer-size=0 is accepted",
        ),
    ),
    *_area(
        "sampler",
        Mutant(
            "ring-missed-off-by-one",
            "src/gpu_exporter/ring.py",
            "        missed = max(0, first - seq - 1)\n",
            "        missed = max(0, first - seq)\n",
            ("tests/unit/test_ring_sampler.py",),
            "a reader that kept up is told it missed a sample (counted as lost)",
        ),
        Mutant(
            "sampler-drifts",
            "src/gpu_exporter/sampler.py",
            "            next_tick += self.interval\n",
            "            next_tick = self._monotonic() + self.interval\n",
            ("tests/unit/test_ring_sampler.py",),
            "each cycle's duration is added to the interval: the schedule drifts",
        ),
    ),
)

# --- issue 20: hostile inputs (web auth under attack, a spool that reads bytes only, identity bounds, twin
# agents, label limits, a bridge bounded in bytes, labels and names). One self-contained block, so that it
# merges apart from the other areas' edits.
_AUTH_TESTS = "tests/unit/web/test_web_auth.py"
_TAMPER = "tests/unit/forward/test_forward_spool_tamper.py"
_SPOOL_CLOCK = "tests/unit/forward/test_forward_spool_clock.py"
_IDENTITY = "tests/unit/config/test_identity_bounds.py::test_identity_options_are_bounded_in_bytes_and_refuse_every_control_character"
_LIMITS = "tests/unit/test_limits.py"
_BRIDGE_LIMITS = "tests/unit/bridge/test_bridge_limits.py"
_BRIDGE_VALUES = "tests/unit/bridge/test_bridge_values.py"
_BRIDGE_BOUNDS = "tests/integration/test_bridge_bounds.py"
MUTANTS += (
    *_area(
        "auth",
        Mutant(
            "auth-long-password-not-cut",
            "src/gpu_exporter/web/auth.py",
            "        return bool(bcrypt.checkpw(password[:_BCRYPT_MAX], hashed))\n",
            "        return bool(bcrypt.checkpw(password, hashed))\n",
            (f"{_AUTH_TESTS}::test_a_password_past_72_bytes_counts_with_its_first_72_as_the_exporter_toolkit_does",),
            "a correct password longer than 72 bytes is refused (pyca/bcrypt 5 raises on it)",
        ),
        Mutant(
            "auth-decoy-cheapest-hash",
            "src/gpu_exporter/web/auth.py",
            '        self._decoy = max(self._users.values(), key=_cost) if self._users else b""\n',
            '        self._decoy = min(self._users.values(), key=_cost) if self._users else b""\n',
            (f"{_AUTH_TESTS}::test_an_unknown_user_costs_a_check_against_the_costliest_configured_hash",),
            "an unknown user is checked against the cheapest hash: answered faster, user names can be probed",
        ),
        Mutant(
            "auth-unknown-user-with-decoy-password",
            "src/gpu_exporter/web/auth.py",
            "        return Verdict.OK if outcome is True and known else Verdict.DENIED\n",
            "        return Verdict.OK if outcome is True else Verdict.DENIED\n",
            (f"{_AUTH_TESTS}::test_an_unknown_user_costs_a_check_against_the_costliest_configured_hash",),
            "any user name with the password of the user whose hash is the decoy is let in",
        ),
        Mutant(
            "auth-suspect-ranks-with-fresh",
            "src/gpu_exporter/web/auth.py",
            "                return 2 if suspect else 1, now\n",
            "                return 1, now\n",
            (f"{_AUTH_TESTS}::test_a_fresh_pair_from_a_refused_connection_ranks_after_one_from_a_new_connection",),
            "a flood's keep-alive connection ranks its fresh wrong passwords with a scraper's first check",
        ),
        Mutant(
            "auth-retry-not-ahead",
            "src/gpu_exporter/web/auth.py",
            "            return 0, first\n",
            "            return 1, first\n",
            (f"{_AUTH_TESTS}::test_a_full_queue_refuses_a_fresh_pair_and_takes_a_retried_one_ahead_of_the_others",),
            "a scraper retrying after a 429 waits behind the flood's fresh pairs again",
        ),
        Mutant(
            "authpool-full-queue-pushes-out-best",
            "src/gpu_exporter/web/authpool.py",
            "                self._queue.pop()\n                youngest.finish(_BUSY)\n",
            "                youngest = self._queue.pop(0)\n                youngest.finish(_BUSY)\n",
            (f"{_AUTH_TESTS}::test_a_full_queue_refuses_a_fresh_pair_and_takes_a_retried_one_ahead_of_the_others",),
            "a full check queue pushes out its best-ranked check (a scraper's retry) instead of its lowest",
        ),
        Mutant(
            "authpool-runs-lowest-rank-first",
            "src/gpu_exporter/web/authpool.py",
            "                job = self._queue.pop(0)\n",
            "                job = self._queue.pop()\n",
            (f"{_AUTH_TESTS}::test_a_full_queue_refuses_a_fresh_pair_and_takes_a_retried_one_ahead_of_the_others",),
            "the check pool runs the lowest-ranked check first: a flood's newest pair before the scraper's",
        ),
        Mutant(
            "ratelimit-burst-uncapped",
            "src/gpu_exporter/web/ratelimit.py",
            "            self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._at) / self.interval)\n",
            "            self._tokens = self._tokens + max(0.0, now - self._at) / self.interval\n",
            (f"{_AUTH_TESTS}::test_rate_limit_lets_exactly_its_burst_through_and_an_idle_hour_refills_no_more",),
            "rate_limit's tokens pile up while idle: after a quiet hour any burst goes through",
        ),
        Mutant(
            "ratelimit-last-token-unused",
            "src/gpu_exporter/web/ratelimit.py",
            "            if self._tokens >= 1.0:\n",
            "            if self._tokens > 1.0:\n",
            (f"{_AUTH_TESTS}::test_rate_limit_lets_exactly_its_burst_through_and_an_idle_hour_refills_no_more",),
            "rate_limit lets one request fewer than its burst through",
        ),
    ),
    *_area(
        "web",
        Mutant(
            "web-evicts-best-ranked-check",
            "src/gpu_exporter/web/server.py",
            "            return max(queued, key=lambda c: c.job.order if c.job is not None else (0, 0.0, 0))\n",
            "            return min(queued, key=lambda c: c.job.order if c.job is not None else (0, 0.0, 0))\n",
            ("tests/unit/web/test_web_rules.py::test_at_the_cap_a_password_check_queued_first_keeps_its_connection",),
            "at the cap the connection whose password check ranks first (a scraper's) is closed, not the flood's last",
        ),
    ),
    *_area(
        "spool",
        Mutant(
            "spool-unpickles-pickle-rows",
            "src/gpu_exporter/forward/spool_disk.py",
            '        reason = {MODE_PICKLE: "pickle", MODE_TEXT: "text"}.get(mode, "mode")\n',
            "        if mode == MODE_PICKLE:\n            return super().fetch(mode, filename, value, read)\n"
            '        reason = {MODE_TEXT: "text"}.get(mode, "mode")\n',
            (f"{_TAMPER}::test_a_planted_pickle_value_never_runs_and_is_moved_aside_and_counted",),
            "a row marked as a pickle is handed to diskcache, which unpickles it: a planted row runs code",
        ),
        Mutant(
            "spool-value-file-any-name",
            "src/gpu_exporter/forward/spool_disk.py",
            "        if not isinstance(filename, str) or not _FILENAME.fullmatch(filename):\n            return None\n",
            "        if not isinstance(filename, str):\n            return None\n",
            (f"{_TAMPER}::test_a_row_in_any_other_form_is_moved_aside_and_counted_by_reason",),
            "a row's file name is read whatever it is: ../../etc/shadow ends up in a batch",
        ),
        Mutant(
            "spool-removes-file-outside",
            "src/gpu_exporter/forward/spool_disk.py",
            "        if isinstance(file_path, str) and _FILENAME.fullmatch(file_path):\n",
            "        if isinstance(file_path, str):\n",
            (f"{_TAMPER}::test_a_row_in_any_other_form_is_moved_aside_and_counted_by_reason",),
            "deleting a planted row removes the file it names: ../../outside is deleted as the agent",
        ),
        Mutant(
            "spool-refused-row-not-counted",
            "src/gpu_exporter/forward/spool.py",
            "        if isinstance(data, Refused):\n            self._reject(data.reason)\n            self.quarantine(",
            "        if isinstance(data, Refused):\n            self.quarantine(",
            (f"{_TAMPER}::test_a_planted_pickle_value_never_runs_and_is_moved_aside_and_counted",),
            "a row in another form than raw bytes is moved aside but not counted in spool_rejected_total",
        ),
        Mutant(
            "spool-wal-last-frame-unchecked",
            "src/gpu_exporter/forward/spool_disk.py",
            "            while offset + 24 + page <= min(size, 32 + _WAL_CHECK_MAX):\n",
            "            while offset + 24 + page < min(size, 32 + _WAL_CHECK_MAX):\n",
            (f"{_TAMPER}::test_a_wal_damaged_in_its_last_frame_only_is_counted",),
            "the WAL's last frame is never verified: a damaged last commit is lost without being counted",
        ),
        Mutant(
            "spool-wal-lost-bytes-whole-file",
            "src/gpu_exporter/forward/spool_faults.py",
            "        self.wal_lost_bytes += damage.lost\n",
            "        self.wal_lost_bytes += damage.size\n",
            (f"{_TAMPER}::test_a_garbage_wal_is_counted_with_its_size_and_kept_aside",),
            "a WAL damaged from its fourth frame counts the whole file as lost",
        ),
        Mutant(
            "spool-ages-on-wall-clock",
            "src/gpu_exporter/forward/spool.py",
            "        limit_ms = self._age.now_ms() - self.max_age * 1000\n",
            "        limit_ms = int(time.time() * 1000) - self.max_age * 1000\n",
            (f"{_SPOOL_CLOCK}::test_a_wall_clock_step_while_running_changes_no_age",),
            "max_age compares spool-time stamps with the wall clock: a +5 days step drops batches seconds old",
        ),
        Mutant(
            "spool-reboot-restarts-at-wall-clock",
            "src/gpu_exporter/forward/spool_clock.py",
            '            start, how = state["spool"] + now, "after a reboot: the time the machine was off not counted"\n',
            '            start, how = self._wall(), "after a reboot: the time the machine was off not counted"\n',
            (f"{_SPOOL_CLOCK}::test_across_a_reboot_the_time_off_is_not_counted_and_the_uptime_is",),
            "after a reboot spool time restarts at the wall clock: a step across the reboot ages fresh batches",
        ),
        Mutant(
            "spool-same-boot-counts-uptime-twice",
            "src/gpu_exporter/forward/spool_clock.py",
            '            start, how = state["spool"] + (now - state["elapsed"]), ',
            '            start, how = state["spool"] + now, ',
            (f"{_SPOOL_CLOCK}::test_an_agent_restart_counts_the_time_it_was_down_and_no_step",),
            "an agent restart within a boot adds the machine's whole uptime to every batch's age",
        ),
        Mutant(
            "spool-clock-below-newest-stamp",
            "src/gpu_exporter/forward/spool_clock.py",
            "        if newest_ms is not None and start * 1000 < newest_ms:\n",
            "        if False:\n",
            (
                f"{_SPOOL_CLOCK}::"
                "test_a_spool_without_clock_state_keeps_wall_clock_ages_and_never_goes_below_its_newest_stamp",
            ),
            "a wall clock set back before a start gives spooled batches negative ages: they outlive max_age",
        ),
    ),
    *_area(
        "config",
        Mutant(
            "config-identity-length-in-characters",
            "src/gpu_exporter/config/checks.py",
            '        size = len(value.encode("utf-8"))\n    except UnicodeEncodeError:\n        raise ConfigError(f"--{flag}: not valid UTF-8") from None\n',
            '        size = len(value)\n    except UnicodeEncodeError:\n        raise ConfigError(f"--{flag}: not valid UTF-8") from None\n',
            (_IDENTITY,),
            "identity options are bounded in characters, not bytes: 129 x 'é' (258 bytes) passes as a client id",
        ),
        Mutant(
            "config-username-unbounded",
            "src/gpu_exporter/config/checks.py",
            '        _check_mqtt_string("mqtt.username", config.mqtt_username, MAX_USERNAME)\n',
            '        _check_mqtt_string("mqtt.username", config.mqtt_username, MAX_PASSWORD)\n',
            (_IDENTITY,),
            "--mqtt.username is bounded by MQTT's 65535, not 1024: a 60,000-byte user name fails every turn",
        ),
        Mutant(
            "config-c1-controls-allowed",
            "src/gpu_exporter/config/checks.py",
            "    bad = sorted({c for c in value if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F})\n",
            "    bad = sorted({c for c in value if ord(c) < 0x20})\n",
            (_IDENTITY,),
            "DEL and C1 control characters pass in a client id or user name (MQTT forbids them)",
        ),
        Mutant(
            "reload-keeps-max-rate",
            "src/gpu_exporter/mqtt/settings.py",
            "LINK_LIVE = (*LINK_FIELDS, *LINK_TUNING)\n",
            "LINK_LIVE = LINK_FIELDS\n",
            ("tests/integration/test_reload.py::test_a_reload_changes_the_mqtt_max_rate",),
            "a reload keeps the running --mqtt.max-rate although the forwarder would apply the new one",
        ),
        Mutant(
            "reload-baseline-at-watch-start",
            "src/gpu_exporter/cli.py",
            "    reloader.watch(watched)\n",
            "    reloader.watch(Watched((config.config_file, config.web_config_file)))\n",
            ("tests/unit/config/test_reload_watch.py::test_the_agent_reloads_a_config_file_changed_while_it_starts",),
            "the agent's watch takes its baseline when it starts: a config file changed while it started is never reloaded",
        ),
        Mutant(
            "reload-baseline-after-reading",
            "src/gpu_exporter/filewatch.py",
            "        self._last = stamps\n        return first\n",
            "        return first\n",
            ("tests/unit/config/test_reload_watch.py",),
            "a change is reported again at every look (the baseline never moves): a reload every 2 s for good",
        ),
        Mutant(
            "bridge-web-baseline-after-start",
            "src/gpu_exporter/bridge/cli.py",
            "    watched = Watched((web_path,), every=2.0)  # before the read: a change while the bridge starts is seen\n"
            "    try:\n        web = load_web_config(web_path)\n",
            "    try:\n        web = load_web_config(web_path)\n        watched = Watched((web_path,), every=2.0)\n",
            ("tests/unit/config/test_reload_watch.py::test_the_bridge_serves_a_web_config_changed_while_it_starts",),
            "the bridge stamps its web config file after reading it: a change in between is never served",
        ),
        Mutant(
            "tls-baseline-after-build",
            "src/gpu_exporter/web/tls.py",
            "        self._watched = Watched((files.cert_file, files.key_file, files.client_ca_file), every=1.0)\n"
            "        self._ctx = files.build()\n",
            "        self._ctx = files.build()\n"
            "        self._watched = Watched((files.cert_file, files.key_file, files.client_ca_file), every=1.0)\n",
            (
                "tests/unit/web/test_web_tls.py::test_a_certificate_renewed_while_the_server_reads_it_is_served_at_the_next_look",
            ),
            "the web server stamps its TLS files after loading them: a certificate renewed in between is never served",
        ),
        Mutant(
            "ramp-fast-after-six-pieces",
            "src/gpu_exporter/mqtt/ramp.py",
            "        if self._quick >= QUICK_BYTES:\n",
            "        if self._quick >= QUICK_BYTES or (self._quick > 0 and self.pieces >= 6):\n",
            ("tests/unit/forward/test_segment_ramp.py",),
            "six quick pieces end the ramp: a thin link behind a 1,600-byte token bucket passes for a fast one",
        ),
        Mutant(
            "bridge-keepalive-fixed",
            "src/gpu_exporter/bridge/settings.py",
            '    keepalive: float = _option(ForwardOptions, "mqtt_keepalive")  # seconds\n',
            "    keepalive: float = 30.0  # seconds\n",
            ("tests/unit/config/test_command_help.py::test_the_bridge_takes_its_mqtt_keepalive_from_the_option",),
            "the bridge ignores --mqtt.keepalive: its keepalive is fixed at 30 s",
        ),
    ),
    *_area(
        "labels",
        Mutant(
            "agent-info-key-reserved-label",
            "src/gpu_exporter/limits.py",
            '    if key in RESERVED:\n        return "reserved"\n',
            "",
            (f"{_LIMITS}::test_info_keys_are_capped_and_reserved_or_invalid_names_never_produced",),
            "an info key 'uuid' or 'node' is served as a label: it overrides the device's or the node's own",
        ),
        Mutant(
            "agent-info-key-dunder",
            "src/gpu_exporter/limits.py",
            '    if key.startswith("__"):\n        return "reserved"\n',
            "",
            (f"{_LIMITS}::test_info_keys_are_capped_and_reserved_or_invalid_names_never_produced",),
            "an info key '__tmp' is served as a label (Prometheus reserves __*)",
        ),
        Mutant(
            "agent-info-keys-one-too-many",
            "src/gpu_exporter/limits.py",
            "            if len(out) >= MAX_INFO_KEYS:\n",
            "            if len(out) > MAX_INFO_KEYS:\n",
            (f"{_LIMITS}::test_info_keys_are_capped_and_reserved_or_invalid_names_never_produced",),
            "gpu_info carries 33 info keys, one past the documented 32",
        ),
        Mutant(
            "agent-cut-value-too-long",
            "src/gpu_exporter/limits.py",
            '    head = raw[: MAX_VALUE - _HASH - 1].decode("utf-8", "ignore")',
            '    head = raw[:MAX_VALUE].decode("utf-8", "ignore")',
            (f"{_LIMITS}::test_a_long_value_is_cut_with_a_hash_so_two_long_values_stay_two",),
            "a long label value is cut to 256 bytes and then the hash added: 269 bytes, past the bound",
        ),
        Mutant(
            "agent-series-label-bound-in-characters",
            "src/gpu_exporter/limits.py",
            "            if any(len(v) > MAX_VALUE // 4 for v in labels):",
            "            if any(len(v) > MAX_VALUE for v in labels):",
            (f"{_LIMITS}::test_values_of_few_characters_but_many_bytes_are_cut_in_every_label_of_every_sample",),
            "a series label of 100 emoji (400 bytes) skips the cut: the bound is checked in characters",
        ),
        Mutant(
            "agent-device-label-bound-in-characters",
            "src/gpu_exporter/limits.py",
            "        if all(len(f) <= MAX_VALUE // 4 for f in fields):\n",
            "        if all(len(f) <= MAX_VALUE for f in fields):\n",
            (f"{_LIMITS}::test_values_of_few_characters_but_many_bytes_are_cut_in_every_label_of_every_sample",),
            "a device label (uuid) of 100 emoji skips the cut: the bound is checked in characters",
        ),
        Mutant(
            "agent-info-value-bound-in-characters",
            "src/gpu_exporter/limits.py",
            "            and all(len(v) <= MAX_VALUE // 4 for v in info.values())\n",
            "            and all(len(v) <= MAX_VALUE for v in info.values())\n",
            (f"{_LIMITS}::test_values_of_few_characters_but_many_bytes_are_cut_in_every_label_of_every_sample",),
            "once its keys are known, an info value of 100 emoji skips the cut: checked in characters",
        ),
        Mutant(
            "agent-inf-kept",
            "src/gpu_exporter/limits.py",
            "            if not math.isfinite(value):\n",
            "            if math.isnan(value):\n",
            (f"{_LIMITS}::test_nan_and_inf_are_dropped_and_counted_and_a_counter_going_back_is_sent_and_counted",),
            "+Inf and -Inf readings are served and sent (only NaN is dropped)",
        ),
        Mutant(
            "bridge-info-key-dunder",
            "src/gpu_exporter/bridge/labels.py",
            '    if name.startswith("__"):\n        return "reserved"\n',
            "",
            (_BRIDGE_VALUES,),
            "an info key '__tmp' becomes a label of gpu_info",
        ),
        Mutant(
            "bridge-info-key-overrides-node",
            "src/gpu_exporter/bridge/labels.py",
            '        why = refusal(key) or ("reserved" if key in reserved else None)\n',
            "        why = refusal(key)\n",
            (_BRIDGE_VALUES, "tests/integration/test_bridge_acl.py"),
            "an info key 'node' or 'uuid' is written as a label: a node's gpu_info claims another node",
        ),
        Mutant(
            "bridge-info-labels-one-too-many",
            "src/gpu_exporter/bridge/labels.py",
            "        if why is None and len(kept) >= MAX_INFO_LABELS:\n",
            "        if why is None and len(kept) > MAX_INFO_LABELS:\n",
            (_BRIDGE_VALUES,),
            "gpu_info gets 33 identity labels, one past the documented 32",
        ),
    ),
    *_area(
        "twins",
        Mutant(
            "twins-failed-attempt-keeps-streak",
            "src/gpu_exporter/forward/twins.py",
            "            self._early.clear()  # the broker was not reachable or refused: not a twin's doing\n",
            "            pass  # the broker was not reachable or refused: not a twin's doing\n",
            (
                "tests/integration/test_twins.py::test_a_failed_attempt_a_timeout_or_a_long_connection_breaks_the_pattern",
            ),
            "a flapping network (connections that fail between early losses) is reported as a twin agent",
        ),
        Mutant(
            "twins-streak-window-ignored",
            "src/gpu_exporter/forward/twins.py",
            "        if len(self._early) == STREAK and now - self._early[0] <= WINDOW:\n",
            "        if len(self._early) == STREAK:\n",
            ("tests/integration/test_twins.py::test_early_losses_spread_over_more_than_the_window_are_no_twin",),
            "three early losses an hour apart are reported as a twin agent",
        ),
        Mutant(
            "bridge-twins-half-overlap",
            "src/gpu_exporter/bridge/twins.py",
            "            if other != boot and now - heard <= LIVE and first_ms <= last and first <= last_ms:\n",
            "            if other != boot and now - heard <= LIVE and first <= last_ms:\n",
            (f"{_BRIDGE_LIMITS}::test_two_live_boots_of_one_node_are_twins_a_restart_with_its_backlog_is_not",),
            "every agent restart is counted as a twin (a new boot's samples after the old one's 'overlap' it)",
        ),
        Mutant(
            "bridge-twins-forget-newest-boot",
            "src/gpu_exporter/bridge/twins.py",
            "                del boots[min(boots, key=lambda b: boots[b][2])]\n",
            "                del boots[max(boots, key=lambda b: boots[b][2])]\n",
            (f"{_BRIDGE_LIMITS}::test_a_node_that_restarted_several_times_has_each_batch_of_its_twin_counted",),
            "past four remembered boots the most recently heard is forgotten, not the oldest: a live twin is missed",
        ),
        Mutant(
            "bridge-twins-dead-boot-live",
            "src/gpu_exporter/bridge/twins.py",
            "            if other != boot and now - heard <= LIVE and first_ms <= last and first <= last_ms:\n",
            "            if other != boot and first_ms <= last and first <= last_ms:\n",
            (f"{_BRIDGE_LIMITS}::test_a_boot_silent_for_longer_than_live_is_no_twin_of_a_new_boot_that_overlaps_it",),
            "a boot not heard from for an hour still counts as live: a clock stepped back reads as a twin forever",
        ),
    ),
    *_area(
        "bridge",
        Mutant(
            "inflight-bytes-checked-before-adding",
            "src/gpu_exporter/bridge/inflight.py",
            "        return self._count > 0 and (self._count >= self.max_messages or self._bytes + size > self.max_bytes)\n",
            "        return self._count > 0 and (self._count >= self.max_messages or self._bytes > self.max_bytes)\n",
            (
                f"{_BRIDGE_BOUNDS}::test_a_message_flood_while_remote_write_fails_is_held_in_bytes_and_nothing_is_lost",
                f"{_BRIDGE_BOUNDS}::test_paho_waits_at_the_bound_until_the_writer_releases",
            ),
            "the byte bound is checked without the incoming message: the bridge holds one message past it",
        ),
        Mutant(
            "inflight-reused-id-skipped",
            "src/gpu_exporter/bridge/inflight.py",
            "            if dup and msg.qos and msg.mid in self._held:\n",
            "            if msg.qos and msg.mid in self._held:\n",
            (f"{_BRIDGE_BOUNDS}::test_a_redelivery_of_a_held_message_is_skipped_and_acknowledged_once",),
            "a new message reusing a held message's packet id is skipped as a redelivery: it is never written",
        ),
        Mutant(
            "inflate-limit-max-payload-wins",
            "src/gpu_exporter/payload/frame.py",
            "    return min(max_bytes, max(INFLATE_FLOOR, INFLATE_RATIO * compressed))\n",
            "    return max(max_bytes, min(INFLATE_FLOOR, INFLATE_RATIO * compressed))\n",
            (f"{_BRIDGE_BOUNDS}::test_a_compression_bomb_stops_at_the_inflate_limit",),
            "the inflate ratio is not applied: a 16 KB bomb inflates to --bridge.max-payload before it is refused",
        ),
        Mutant(
            "packet-size-without-overhead",
            "src/gpu_exporter/bridge/settings.py",
            "    return min(settings.max_packet_size or settings.max_payload + PACKET_OVERHEAD, MQTT_MAX_PACKET)\n",
            "    return min(settings.max_packet_size or settings.max_payload, MQTT_MAX_PACKET)\n",
            (f"{_BRIDGE_BOUNDS}::test_the_broker_keeps_messages_over_the_announced_packet_size",),
            "the announced Maximum Packet Size leaves no room for the topic and header: a payload at the limit never arrives",
        ),
        Mutant(
            "budget-fleet-never-counts",
            "src/gpu_exporter/bridge/limits.py",
            "        state.cur.insert(at, h)\n        self.total += 1\n",
            "        state.cur.insert(at, h)\n",
            (f"{_BRIDGE_LIMITS}::test_the_fleet_budget_caps_every_node_together_and_frees_what_went_quiet",),
            "new series are not counted against the fleet budget: a flood over many names has no fleet cap",
        ),
        Mutant(
            "budget-fleet-one-over",
            "src/gpu_exporter/bridge/limits.py",
            "        if self.total >= self.fleet:\n",
            "        if self.total > self.fleet:\n",
            (f"{_BRIDGE_LIMITS}::test_the_fleet_budget_caps_every_node_together_and_frees_what_went_quiet",),
            "the fleet budget lets one series past --bridge.max-series",
        ),
        Mutant(
            "budget-quiet-node-keeps-share",
            "src/gpu_exporter/bridge/limits.py",
            "            self.total -= len(node.prev)\n",
            "            self.total -= 0\n",
            (f"{_BRIDGE_LIMITS}::test_the_fleet_budget_caps_every_node_together_and_frees_what_went_quiet",),
            "series that stopped never give their share of the fleet budget back: after a flood, no new node writes",
        ),
        Mutant(
            "budget-node-cap-forgets-last-window",
            "src/gpu_exporter/bridge/limits.py",
            "        if len(state.cur) + len(state.prev) >= self.per_node:\n",
            "        if len(state.cur) >= self.per_node:\n",
            (
                f"{_BRIDGE_LIMITS}::test_a_node_whose_series_change_holds_no_more_than_its_cap_until_the_old_ones_go_quiet",
            ),
            "the per-node cap counts only this window's series: a node rotating names holds twice its cap",
        ),
        Mutant(
            "new-nodes-tokens-pile-up",
            "src/gpu_exporter/bridge/limits.py",
            "            self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_minute / 60.0)\n",
            "            self._tokens = self._tokens + (now - self._at) * self.per_minute / 60.0\n",
            (f"{_BRIDGE_LIMITS}::test_new_name_tokens_never_pile_up_past_the_burst_and_introduced_names_alone_pass",),
            "new-name tokens pile up while no name is new: after a quiet day a flood brings 14,400 names at once",
        ),
        Mutant(
            "new-nodes-introduction-admits-anyone",
            "src/gpu_exporter/bridge/limits.py",
            "            if self._still_introducing(now) and node in self._introduced:\n",
            "            if self._still_introducing(now):\n",
            (f"{_BRIDGE_LIMITS}::test_new_name_tokens_never_pile_up_past_the_burst_and_introduced_names_alone_pass",),
            "while the fleet introduces itself any name is admitted, with a status message or not",
        ),
        Mutant(
            "values-inf-kept",
            "src/gpu_exporter/bridge/values.py",
            "        bad = [k for k, v in enumerate(col) if v is not None and not math.isfinite(v)]\n",
            "        bad = [k for k, v in enumerate(col) if v is not None and math.isnan(v)]\n",
            (_BRIDGE_VALUES,),
            "+Inf and -Inf reach remote write (only NaN is dropped)",
        ),
        Mutant(
            "values-new-boot-keeps-marks",
            "src/gpu_exporter/bridge/values.py",
            '            self.marks = array("d", bytes(8 * len(self.keys)))\n',
            "",
            (_BRIDGE_VALUES,),
            "a new boot's counters are held to the old boot's high marks: an agent restart drops them as backwards",
        ),
        Mutant(
            "values-backlog-held-to-marks",
            "src/gpu_exporter/bridge/values.py",
            "        newer = seqs[0] > self.newest_seq\n",
            "        newer = True\n",
            (_BRIDGE_VALUES,),
            "a backlog sent after fresh data is held to the fresh data's high marks: its counters are dropped",
        ),
        Mutant(
            "values-reset-one-batch-late",
            "src/gpu_exporter/bridge/values.py",
            "            if streak >= RESET_AFTER:\n",
            "            if streak > RESET_AFTER:\n",
            (_BRIDGE_VALUES,),
            "a counter reset within a boot is taken one batch later than documented: a batch more is dropped",
        ),
        Mutant(
            "values-fast-path-ignores-marks",
            "src/gpu_exporter/bridge/values.py",
            "            if not all(map(operator.ge, firsts, self.marks if newer else repeat(0.0))):\n",
            "            if not all(map(operator.ge, firsts, repeat(0.0))):\n",
            (_BRIDGE_VALUES,),
            "a counter that goes back between two batches is written (only a fall within a batch is caught)",
        ),
        Mutant(
            "bridge-password-read-once",
            "src/gpu_exporter/mqtt/client.py",
            "    client.on_pre_connect = reread\n",
            "    pass\n",
            (
                "tests/integration/test_bridge_acl.py::test_a_rotated_password_file_is_read_again_when_the_bridge_reconnects",
            ),
            "a rotated MQTT password file is not read again: the bridge is refused until a restart",
        ),
    ),
)


def _copy_tree(dest: Path) -> None:
    """The files git knows of (tracked, or new and not ignored), links kept as links."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        src, dst = ROOT / name, dest / name
        if not src.is_symlink() and not src.exists():
            continue  # deleted in the working tree
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def _test_exists(test: str) -> bool:
    """A test file, or a ``file::function`` node id whose function the file defines."""
    path, _, function = test.partition("::")
    if not (ROOT / path).is_file():
        return False
    name = function.partition("[")[0]
    return not name or f"def {name}(" in (ROOT / path).read_text(encoding="utf-8")


def _baseline_tests(mutants: list[Mutant]) -> tuple[str, ...]:
    """Every test the mutants name, a node id left out where its whole file is listed (run once)."""
    tests = {t for m in mutants for t in m.tests}
    return tuple(sorted(t for t in tests if "::" not in t or t.partition("::")[0] not in tests))


def check_snippets(mutants: list[Mutant]) -> list[str]:
    problems = []
    for m in mutants:
        missing = [t for t in m.tests if not _test_exists(t)]
        if missing:  # pytest would fail on them, which would read as a kill
            problems.append(f"{m.name}: no such test: {', '.join(missing)}")
        text = (ROOT / m.path).read_text(encoding="utf-8")
        count = text.count(m.old)
        if count != 1:
            problems.append(f"{m.name}: snippet found {count} times in {m.path} (expected once): {m.old!r}")
            continue
        try:
            compile(text.replace(m.old, m.new), m.path, "exec")
        except SyntaxError as exc:
            problems.append(f"{m.name}: the mutated {m.path} does not compile: {exc}")
    return problems


def _pytest(tree: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """'pass', 'fail' or 'timeout', the seconds it took, and the end of pytest's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_EXPORTER_")}
    env["PYTHONPATH"] = str(tree / "src")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("CI", None)  # a skip is not a kill, and must not turn into one either
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *tests]
    try:
        result = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started, ""
    tail = (result.stdout + result.stderr).decode(errors="replace")[-3000:]
    return ("pass" if result.returncode == 0 else "fail"), time.monotonic() - started, tail


def _failures(tail: str) -> list[str]:
    """The tests pytest reported as failed, from the end of its output."""
    return [line for line in tail.splitlines() if line.startswith(("FAILED ", "ERROR "))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--area", nargs="+", metavar="AREA", help="run only the mutants of these areas")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run (default %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="name the failing tests of each kill")
    args = parser.parse_args(argv)

    mutants = list(MUTANTS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutants})
        if unknown:
            parser.error(f"unknown mutant(s): {', '.join(unknown)}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.area:
        unknown = sorted(set(args.area) - {m.area for m in mutants})
        if unknown:
            parser.error(f"unknown area(s): {', '.join(unknown)} (see --list)")
        mutants = [m for m in mutants if m.area in args.area]
    if args.list:
        for m in mutants:
            print(f"{m.area:10} {m.name:42} {m.path:44} {m.why}")
        return 0
    problems = check_snippets(mutants)
    if problems:
        for line in problems:
            print(f"mutate: {line}", file=sys.stderr)
        print("mutate: the code or tests moved under a mutant; update tools/mutate.py", file=sys.stderr)
        return 2

    began = time.monotonic()
    width = max(len(m.name) for m in mutants)
    with tempfile.TemporaryDirectory(prefix="gpu-exporter-mutate-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        baseline = _baseline_tests(mutants)
        print(f"baseline: {len(baseline)} test files and tests on the unmutated copy ...", flush=True)
        outcome, took, tail = _pytest(tree, baseline, args.timeout * 4)
        if outcome != "pass":
            print(tail, file=sys.stderr)
            print(f"mutate: the unmutated tests did not pass ({outcome}); fix them first", file=sys.stderr)
            return 2
        print(f"baseline: pass ({took:.0f} s)", flush=True)

        rows = []
        for m in mutants:
            target = tree / m.path
            pristine = (ROOT / m.path).read_text(encoding="utf-8")
            target.write_text(pristine.replace(m.old, m.new), encoding="utf-8")
            try:
                outcome, took, tail = _pytest(tree, m.tests, args.timeout)
            finally:
                target.write_text(pristine, encoding="utf-8")
            verdict = "survived" if outcome == "pass" else "killed" + (" (timeout)" if outcome == "timeout" else "")
            rows.append((m, verdict, took))
            print(f"  {m.area:10} {m.name:{width}} {verdict:18} {took:5.0f} s", flush=True)
            if args.verbose and outcome == "fail":
                for line in _failures(tail)[:3]:
                    print(f"      {line[:160]}", flush=True)

    print()
    print(f"{'area':10} {'mutant':{width}}  {'result':18} bug")
    for m, verdict, _took in rows:
        print(f"{m.area:10} {m.name:{width}}  {verdict:18} {m.why}")
    print()
    print(f"{'area':10} {'mutants':>7} {'killed':>6} {'survived':>8} {'seconds':>7}")
    for area in dict.fromkeys(m.area for m, _, _ in rows):
        mine = [(verdict, took) for m, verdict, took in rows if m.area == area]
        killed = sum(1 for verdict, _ in mine if verdict != "survived")
        seconds = sum(took for _, took in mine)
        print(f"{area:10} {len(mine):7} {killed:6} {len(mine) - killed:8} {seconds:7.0f}")
    survivors = [m.name for m, verdict, _ in rows if verdict == "survived"]
    print()
    print(
        f"{len(rows)} mutants, {len(rows) - len(survivors)} killed, {len(survivors)} survived "
        f"({time.monotonic() - began:.0f} s in all)"
    )
    if survivors:
        print(f"survived: {', '.join(survivors)}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
