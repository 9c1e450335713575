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
    tests: tuple[str, ...]
    why: str  # the bug, as a reviewer would describe it


MUTANTS = (
    # -- the payload codec (forward/batch.py) ---------------------------------------------------------
    Mutant(
        "codec-untyped-seq",
        "src/gpu_exporter/forward/batch.py",
        '    if not isinstance(value, list):\n        raise PayloadError(f"{where} must be an array, not {_jtype(value)}")\n'
        "    out: list[int] = []\n",
        "    out: list[int] = []\n",
        ("tests/test_forward_batch.py",),
        "seq/time_ms not checked to be arrays: a number there raises TypeError inside the decoder",
    ),
    Mutant(
        "codec-second-order",
        "src/gpu_exporter/forward/batch.py",
        "        deltas = deltas[:1] + list(itertools.accumulate(deltas[1:]))\n",
        "        deltas = list(itertools.accumulate(deltas))\n",
        ("tests/test_forward_batch.py",),
        "second-order deltas undone from the wrong start: smooth columns decode to wrong values",
    ),
    Mutant(
        "codec-reference-sign",
        "src/gpu_exporter/forward/batch.py",
        '        if sign < 0:\n            ref["sign"] = -1\n',
        "",
        ("tests/test_forward_batch.py",),
        "a column moving against an earlier one (memory free vs used) is encoded as moving with it",
    ),
    # -- the bridge's column reader (bridge/columns.py) -----------------------------------------------
    Mutant(
        "columns-empty-array",
        "src/gpu_exporter/bridge/columns.py",
        "            form = col[0] if col else None\n",
        "            form = col[0]\n",
        ("tests/test_bridge_columns.py", "tests/test_bridge_fuzz.py"),
        "an empty array column raises IndexError in the reader instead of a refusal",
    ),
    Mutant(
        "columns-second-order",
        "src/gpu_exporter/bridge/columns.py",
        "            deltas = deltas[:1] + list(accumulate(deltas[1:]))  # back to first-order deltas\n",
        "            deltas = list(accumulate(deltas))\n",
        ("tests/test_bridge_columns.py",),
        "the fast path undoes second-order deltas wrongly: the bridge writes wrong values",
    ),
    # -- the spool (forward/spool.py) ----------------------------------------------------------------
    Mutant(
        "spool-caps-drop-inflight",
        "src/gpu_exporter/forward/spool.py",
        "            if (entry == keep and len(self._index) > 1) or entry.key in self.pinned:\n",
        "            if entry == keep and len(self._index) > 1:\n",
        ("tests/test_forward_spool.py",),
        "the byte cap drops a batch the broker is acknowledging: counted as lost and as delivered",
    ),
    Mutant(
        "spool-log-every-refusal",
        "src/gpu_exporter/forward/spool.py",
        "        if not self._refusing or now - self._logged_at >= _LOG_EVERY:\n",
        "        if True:\n",
        ("tests/test_forward_spool.py",),
        "a full disk logs one line per refused batch instead of one",
    ),
    # -- the forwarder (forward/service.py) ----------------------------------------------------------
    Mutant(
        "forwarder-refusal-as-ack",
        "src/gpu_exporter/forward/service.py",
        "        if not ok:\n            self.metrics.publish_errors.inc()\n",
        "        if False:\n            self.metrics.publish_errors.inc()\n",
        ("tests/test_forward_paths.py",),
        "a batch the broker refused is deleted from the spool as if acknowledged",
    ),
    Mutant(
        "forwarder-replay-burst",
        "src/gpu_exporter/forward/service.py",
        "        self._tokens = min(max(1.0, rate), self._tokens + (now - self._tokens_at) * rate)\n",
        "        self._tokens = self._tokens + (now - self._tokens_at) * rate\n",
        ("tests/test_forward_paths.py",),
        "after a pause the replay rate's tokens pile up: the backlog goes out in one burst",
    ),
    Mutant(
        "forwarder-keeps-corrupt-journal",
        "src/gpu_exporter/forward/service.py",
        "                self.spool.forget_journal([key])\n",
        "",
        ("tests/test_forward_paths.py",),
        "a corrupt journal entry stays in the spool and is counted again at every start",
    ),
    Mutant(
        "forwarder-batch-one-late",
        "src/gpu_exporter/forward/service.py",
        "        if len(b.samples) >= self.config.mqtt_batch_max_samples:\n",
        "        if len(b.samples) > self.config.mqtt_batch_max_samples:\n",
        ("tests/test_forward_paths.py",),
        "a batch closes one sample after --mqtt.batch-max-samples",
    ),
    # -- the bridge's sender (bridge/sender.py) and writer (bridge/service.py) ------------------------
    Mutant(
        "sender-ignores-retry-after",
        "src/gpu_exporter/bridge/sender.py",
        "            wait = max(delay, retry_after or 0.0)\n",
        "            wait = delay\n",
        ("tests/test_bridge_sender.py", "tests/test_bridge_paths.py"),
        "a 429's Retry-After is ignored: the bridge hammers a receiver that asked it to wait",
    ),
    Mutant(
        "sender-uncapped-wait",
        "src/gpu_exporter/bridge/sender.py",
        "            wait = min(wait, self._backoff_max) * random.uniform(0.8, 1.0)\n",
        "            wait = wait * random.uniform(0.8, 1.0)\n",
        ("tests/test_bridge_paths.py",),
        "a receiver's Retry-After of an hour stalls the whole fleet's stream past --remote-write.max-backoff",
    ),
    Mutant(
        "sender-condemns-older-half",
        "src/gpu_exporter/bridge/sender.py",
        "        if verdict.ordered and newer_all_refused:\n",
        "        if verdict.ordered:\n",
        ("tests/test_bridge_sender.py",),
        "after a 'too old' refusal the older half is dropped even though the newer half was written",
    ),
    Mutant(
        "bridge-fresh-as-replay",
        "src/gpu_exporter/bridge/service.py",
        "if seqs[i] not in taken]\n",
        "if seqs[i] in taken]\n",
        ("tests/test_bridge_fuzz.py",),
        "every fresh sample is taken for a replay and never written",
    ),
    # -- the NVML backend's lost-GPU backoff (backends/_calls.py) ------------------------------------
    Mutant(
        "backend-asks-lost-gpu",
        "src/gpu_exporter/backends/_calls.py",
        "        if not live.up and now < live.retry_at:\n",
        "        if False:\n",
        ("tests/test_nvml_backend.py",),
        "a lost GPU is asked every cycle during its backoff (each call can hang for seconds)",
    ),
    # -- adaptive forwarding on weak links (forward/summary.py, link_meter.py, adaptive.py; bridge) -----
    Mutant(
        "summary-max-is-last",
        "src/gpu_exporter/forward/summary.py",
        '                out[(f"{key}:max", labels)] = st.high\n',
        '                out[(f"{key}:max", labels)] = st.last\n',
        ("tests/test_forward_summary.py",),
        "a summary's max is the window's last value: a spike inside the window is lost",
    ),
    Mutant(
        "link-meter-counts-latency",
        "src/gpu_exporter/forward/link_meter.py",
        "            busy -= min(latency, rtt)\n",
        "            busy -= 0.0\n",
        ("tests/test_forward_summary.py",),
        "a batch sent alone counts the round trip as transfer time: a far but fast link looks weak",
    ),
    Mutant(
        "adaptive-raw-ahead-of-summaries",
        "src/gpu_exporter/forward/adaptive.py",
        "        return bool(rate) and (self.meter.inflight_bytes() + size) / rate <= 0.8 * until_next\n",
        "        return True\n",
        ("tests/test_forward_summary.py",),
        "on a weak link full-resolution batches fill the link and the next summary waits behind them",
    ),
    Mutant(
        "bridge-summary-as-raw-replay",
        "src/gpu_exporter/bridge/service.py",
        '    stream = batch.boot + "/summary" if batch.summary_ms else batch.boot\n',
        "    stream = batch.boot\n",
        ("tests/test_bridge_summaries.py",),
        "summaries share the raw samples' replay memory: the full resolution that follows them is dropped",
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


def _check_snippets(mutants: list[Mutant]) -> list[str]:
    problems = []
    for m in mutants:
        missing = [t for t in m.tests if not (ROOT / t).is_file()]
        if missing:  # pytest would fail on them, which would read as a kill
            problems.append(f"{m.name}: no such test file: {', '.join(missing)}")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run (default %(default)s)")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)

    mutants = list(MUTANTS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in mutants})
        if unknown:
            parser.error(f"unknown mutant(s): {', '.join(unknown)}")
        mutants = [m for m in mutants if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:34} {m.path:40} {m.why}")
        return 0
    problems = _check_snippets(mutants)
    if problems:
        for line in problems:
            print(f"mutate: {line}", file=sys.stderr)
        print("mutate: the code or tests moved under a mutant; update tools/mutate.py", file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="gpu-exporter-mutate-") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        files = sorted({t for m in mutants for t in m.tests})
        print(f"baseline: {len(files)} test files on the unmutated copy ...", flush=True)
        outcome, took, tail = _pytest(tree, tuple(files), args.timeout * 2)
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
                outcome, took, _tail = _pytest(tree, m.tests, args.timeout)
            finally:
                target.write_text(pristine, encoding="utf-8")
            verdict = "survived" if outcome == "pass" else "killed" + (" (timeout)" if outcome == "timeout" else "")
            rows.append((m, verdict, took))
            print(f"  {m.name:34} {verdict:18} {took:5.0f} s", flush=True)

    width = max(len(m.name) for m in mutants)
    print()
    print(f"{'mutant':{width}}  {'result':18} {'tests':48} bug")
    for m, verdict, _took in rows:
        tests = ",".join(Path(t).name for t in m.tests)
        print(f"{m.name:{width}}  {verdict:18} {tests:48} {m.why}")
    survivors = [m.name for m, verdict, _ in rows if verdict == "survived"]
    print()
    print(f"{len(rows)} mutants, {len(rows) - len(survivors)} killed, {len(survivors)} survived")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
