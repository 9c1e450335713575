"""hostread: a host file that is a FIFO, a device, endless, or whose read never returns costs its caller
one refused read (an OSError, counted by reason), never a blocked thread or the whole file in memory."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_exporter import hostread
from tests.support import wait_until
from tests.support.fuse import HungFile, available


def _delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in hostread.failures().items() if v != before[k]}


def _refused(path: Path, **kwargs: float) -> str:
    with pytest.raises(hostread.Refused) as caught:
        hostread.read_text(path, **kwargs)  # type: ignore[arg-type]
    return caught.value.reason


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "load"
    os.mkfifo(path)
    return path


def test_a_regular_file_is_read_whole() -> None:
    text = hostread.read_text("/proc/self/status")
    assert text.startswith("Name:") and "VmRSS" in text


def test_a_fifo_without_a_writer_is_refused_before_anything_waits_on_it(fifo: Path) -> None:
    before = hostread.failures()
    assert _refused(fifo) == "not_regular"  # open() of a FIFO for reading waits for a writer
    assert _delta(before) == {"not_regular": 1}


def test_a_fifo_whose_writer_holds_it_open_without_writing_is_refused(fifo: Path) -> None:
    writer = os.open(fifo, os.O_RDWR)  # a writer that never writes: a blocking read would wait forever
    try:
        before = hostread.failures()
        assert _refused(fifo) == "not_regular"
        assert _delta(before) == {"not_regular": 1}
    finally:
        os.close(writer)


def test_a_device_is_refused_without_being_read(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.symlink_to("/dev/zero")  # read whole, it is endless
    assert _refused(meminfo) == "not_regular"


def test_a_file_longer_than_the_cap_is_refused_not_read_to_its_end(tmp_path: Path) -> None:
    endless = tmp_path / "clients"
    with open(endless, "wb") as handle:
        handle.truncate(64 << 30)  # 64 GiB, sparse: read whole it would take minutes and all memory
    before = hostread.failures()
    assert _refused(endless, cap=4096) == "too_large"
    assert _delta(before) == {"too_large": 1}
    endless.write_bytes(b"x" * 4096)
    assert hostread.read_bytes(endless, cap=4096) == b"x" * 4096  # exactly the cap is fine


def test_a_missing_file_is_an_ordinary_oserror_not_counted(tmp_path: Path) -> None:
    before = hostread.failures()
    with pytest.raises(FileNotFoundError):
        hostread.read_text(tmp_path / "gone")
    assert _delta(before) == {}


@pytest.fixture
def hung(tmp_path: Path) -> Iterator[HungFile]:
    why = available()
    if why:
        pytest.skip(why)
    rail = tmp_path / "curr1_input"
    rail.write_text("960\n")
    with HungFile(rail) as hung:
        yield hung


def test_a_read_that_blocks_in_the_kernel_costs_one_wait_once_and_one_thread(hung: HungFile, tmp_path: Path) -> None:
    other = tmp_path / "in1_input"
    other.write_text("5064\n")
    before = hostread.failures()
    assert _refused(hung.path, timeout=0.2) == "timeout"
    assert hostread.stuck() == 1
    for _ in range(5):  # refused at once while the first read still hangs: no second reader thread
        assert _refused(hung.path, timeout=0.2) == "stuck"
        assert hostread.read_text(other, timeout=30) == "5064\n"  # other files are read meanwhile
    assert hung.reads == 1
    assert _delta(before) == {"timeout": 1, "stuck": 5}
    readers = [t for t in threading.enumerate() if t.name == "host-read"]
    assert len(readers) <= 3  # the stuck one and at most two idle


def test_a_stuck_file_is_read_again_once_its_read_has_returned(hung: HungFile) -> None:
    assert _refused(hung.path, timeout=0.2) == "timeout"
    hung.stop()  # the kernel aborts the waiting read; the file is the plain one again
    wait_until(lambda: hostread.stuck() == 0, 5, "the aborted read to return")
    assert hostread.read_text(hung.path) == "960\n"


def test_past_max_stuck_reads_every_other_file_is_refused_as_busy(
    hung: HungFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostread, "MAX_STUCK", 1)
    other = tmp_path / "in1_input"
    other.write_text("5064\n")
    assert _refused(hung.path, timeout=0.2) == "timeout"
    before = hostread.failures()
    assert _refused(other) == "busy"  # no more threads are handed to host files
    assert _delta(before) == {"busy": 1}
    hung.stop()
    wait_until(lambda: hostread.stuck() == 0, 5, "the aborted read to return")
    assert hostread.read_text(other, timeout=30) == "5064\n"
