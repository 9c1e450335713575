"""Where a bridge's time goes, from py-spy's raw profiles (``bench_fleet.py --profile DIR`` records them
with ``start_profilers``).

py-spy records every thread, idle ones included (``--idle``), 50 times a second. Each stack is put in
the first stage whose frame it contains, so the stages of a thread add up to its samples: what the
writer thread spends decoding, converting, encoding, compressing, waiting on the TSDB's answer, or
waiting for messages; and what paho's network thread spends receiving. Also the functions with the
most samples of their own (leaf frames) in the writer thread.

    python bench/fleet_profile.py /tmp/prof/bridge-100-nodes-0.txt /tmp/prof/bridge-1000-nodes-0.txt
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

# (stage, a frame that puts a stack in it), first match wins
STAGES = (
    ("HTTP to the TSDB (send, wait for the answer)", "RemoteWriter._round_trip"),
    ("snappy", "compress (gpu_exporter/bridge/remote_write.py"),
    ("protobuf encode", "WriteEncoder.encode"),
    ("split into requests", "split_by_samples"),
    ("convert (labels, series)", "Converter.convert"),
    ("decode (inflate, JSON, columns)", "MessageHandler.decode"),
    ("replay check", "SeqTracker."),
    ("clock check", "ClockGuard.check"),
    ("acknowledge (paho)", "Client.ack"),
    ("waiting for messages", "Queue.get"),
    ("paho: receive a PUBLISH", "Client._handle_publish"),
    ("paho: write (PUBACK)", "Client.loop_write"),
    ("paho: select()", "select"),
    ("metrics page", "generate_latest"),
)


def stage_of(stack: str) -> str:
    for name, frame in STAGES:
        if frame in stack:
            return name
    return "other"


def analyse(path: Path) -> str:
    threads: Counter[str] = Counter()
    stages: dict[str, Counter[str]] = {}
    leaves: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0].split(": ", 1)[-1]
        thread = "paho" if thread.startswith("paho") else thread
        threads[thread] += n
        stages.setdefault(thread, Counter())[stage_of(stack)] += n
        if thread == "bridge-writer" and stage_of(stack) not in ("waiting for messages",):
            leaves[frames[-1]] += n
    out = [f"{path.name}:"]
    for thread, total in threads.most_common():
        if thread not in ("bridge-writer", "paho"):
            continue
        out.append(f"  thread {thread}: {total} samples")
        for stage, n in stages[thread].most_common():
            out.append(f"    {n / total:6.1%}  {stage}")
    busy = sum(leaves.values())
    if busy:
        out.append("  writer's own time, busiest leaf functions (share of its non-waiting samples):")
        for frame, n in leaves.most_common(12):
            out.append(f"    {n / busy:6.1%}  {frame}")
    return "\n".join(out)


def start_profilers(args: argparse.Namespace, pids: list[int], nodes: int) -> list[subprocess.Popen[bytes]]:
    """py-spy on each bridge (``pids``) over the measured window (raw collapsed stacks), as
    ``bench_fleet.py --profile DIR`` asks."""
    if not args.profile:
        return []
    if shutil.which("py-spy") is None:
        raise SystemExit("--profile needs py-spy (pip install py-spy)")
    out = Path(args.profile)
    out.mkdir(parents=True, exist_ok=True)
    found = []
    for i, pid in enumerate(pids):
        path = out / f"bridge-{nodes}-nodes-{i}-{args.profile_mode}.txt"
        found.append(
            subprocess.Popen(
                [
                    "py-spy",
                    "record",
                    "--nonblocking",
                    "--gil" if args.profile_mode == "cpu" else "--idle",
                    "--threads",
                    "-r",
                    "50",
                    "-f",
                    "raw",
                    "-d",
                    str(int(args.duration)),
                    "-p",
                    str(pid),
                    "-o",
                    str(path),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    return found


def main() -> int:
    for arg in sys.argv[1:]:
        print(analyse(Path(arg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
