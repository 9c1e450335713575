"""The Jetson process scanner over random PID lifecycles with reuse (by class, not by instance).

A procfs tree (``<pid>/fd/<n>`` links to device nodes) changes between scans: processes start, open
the GPU late, close it, exit, and their PIDs come back (the same program or another). The model is the
scanner's documented contract (backends/jetson/procs.py): a new PID and every GPU process are read at
each scan; a PID seen without the GPU is read again once ``rescan`` seconds have passed. So a PID that
was absent at a scan is new when it comes back and is read at once, whatever it was before.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpu_exporter.backends.jetson.procs import ProcessScanner

RESCAN = 30.0
GPU_NODES = ("/dev/nvhost-ctrl-gpu", "/dev/nvgpu/igpu0/ctrl", "/dev/nvhost-gpu")
OTHER = ("/dev/nvmap", "/dev/null", "socket:[1234]")

PIDS = st.sampled_from([7, 42, 4242])  # few, so that they come back often
START = st.tuples(st.just("start"), PIDS, st.booleans())  # a process (with the GPU or not) takes the PID
EXIT = st.tuples(st.just("exit"), PIDS, st.just(False))
EVENT = st.one_of(
    START,
    EXIT,
    START,
    EXIT,
    st.tuples(st.just("open-gpu"), PIDS, st.just(False)),  # a running process opens the GPU late
    st.tuples(st.just("close-gpu"), PIDS, st.just(False)),
    st.tuples(st.just("wait"), st.just(0), st.sampled_from([False, True])),  # a short or a long pause
)
STEPS = st.lists(st.lists(EVENT, max_size=3), min_size=1, max_size=14)  # events between scans


def _write(procfs: Path, pid: int, gpu: bool) -> None:
    fd = procfs / str(pid) / "fd"
    shutil.rmtree(procfs / str(pid), ignore_errors=True)
    fd.mkdir(parents=True)
    targets = [*OTHER, GPU_NODES[pid % len(GPU_NODES)]] if gpu else list(OTHER)
    for n, target in enumerate(targets):
        os.symlink(target, fd / str(n))


@settings(max_examples=250, deadline=None)
@given(steps=STEPS)
@example(steps=[[("start", 7, False)], [("exit", 7, False)], [("start", 7, True)]])  # exits, back with the GPU
def test_the_scanner_reports_what_its_contract_says_over_pid_reuse(steps: list[list[tuple[str, int, bool]]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        procfs = Path(tmp)
        (procfs / "self").mkdir()  # not a PID: never read
        now = [1000.0]
        scanner = ProcessScanner(procfs, rescan=RESCAN, clock=lambda: now[0])
        alive: dict[int, bool] = {}  # pid -> holds the GPU now
        quiet: dict[int, float] = {}  # the model: pid -> when last read without the GPU
        present_before: set[int] = set()
        for events in steps:
            for kind, pid, flag in events:
                if kind == "wait":
                    now[0] += RESCAN if flag else 1.0
                elif kind == "start" and pid not in alive:
                    alive[pid] = flag
                    _write(procfs, pid, flag)
                elif kind == "exit" and pid in alive:
                    del alive[pid]
                    shutil.rmtree(procfs / str(pid))
                elif kind in ("open-gpu", "close-gpu") and pid in alive:
                    alive[pid] = kind == "open-gpu"
                    _write(procfs, pid, alive[pid])
            got = scanner.scan()
            assert got.unreadable == 0
            expect = set()
            for pid, gpu in alive.items():
                last = quiet.get(pid)
                read = pid not in present_before or last is None or now[0] - last >= RESCAN
                if read:
                    if gpu:
                        expect.add(pid)
                        quiet.pop(pid, None)
                    else:
                        quiet[pid] = now[0]
            quiet = {p: t for p, t in quiet.items() if p in alive}
            assert set(got.pids) == expect, (sorted(alive.items()), quiet, now[0])
            assert list(got.pids) == sorted(got.pids)
            # the class of bug this guards: a PID that exited and came back as a GPU process is seen at once
            for pid in alive:
                if alive[pid] and pid not in present_before:
                    assert pid in got.pids
            present_before = set(alive)
            # a process that holds the GPU now and held it at the last scan is never missed
            for pid in expect:
                assert alive[pid]
