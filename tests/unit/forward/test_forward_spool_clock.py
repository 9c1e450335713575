"""Spool ages that a wall-clock step cannot fool: a step of +5 days drops no fresh batch, a step of -5
days keeps no stale one, within a run, across an agent restart and across a reboot; and the real agent
with its wall clock stepped by libfaketime while it runs."""

from __future__ import annotations

import glob
import subprocess
import time
from pathlib import Path

import pytest

from gpu_exporter.forward.spool import Spool
from gpu_exporter.forward.spool_clock import SpoolClock
from tests.support import child_env, exporter_cmd, free_port, http_get, stop_process, wait_until
from tests.unit.forward.test_forward_spool import Drops

DAY = 86400.0


class Machine:
    """The clocks a spool reads: boot time, the wall clock and the boot id, moved by the test."""

    def __init__(self) -> None:
        self.boottime = 1000.0
        self.wall = 1_700_000_000.0
        self.boot = "boot-1"

    def clock(self) -> SpoolClock:
        return SpoolClock(elapsed=lambda: self.boottime, wall=lambda: self.wall, boot=lambda: self.boot)

    def spool(self, directory: Path, drops: Drops, max_age: float = 3600) -> Spool:
        spool = Spool(str(directory), 1 << 30, max_age, on_drop=drops, age=self.clock())
        spool.open()
        return spool

    def run(self, seconds: float) -> None:
        self.boottime += seconds
        self.wall += seconds


@pytest.mark.parametrize("step", [+5 * DAY, -5 * DAY])
def test_a_wall_clock_step_while_running_changes_no_age(tmp_path: Path, step: float) -> None:
    machine, drops = Machine(), Drops()
    spool = machine.spool(tmp_path, drops)
    spool.put(b"a", 1, 1, 1)
    machine.run(10)
    machine.wall += step
    assert spool.expire() == 0 and spool.oldest_age() == 10  # seconds old, whatever the wall clock says
    spool.put(b"b", 2, 2, 1)
    machine.run(3600 - 10 + 1)
    assert spool.expire() == 1 and drops.batches == {"max_age": 1}  # an hour of running: the first goes
    machine.run(10)
    assert spool.expire() == 1 and len(spool) == 0  # and the second, not 5 days later


@pytest.mark.parametrize("step", [+5 * DAY, -5 * DAY])
def test_an_agent_restart_counts_the_time_it_was_down_and_no_step(tmp_path: Path, step: float) -> None:
    machine, drops = Machine(), Drops()
    spool = machine.spool(tmp_path, drops)
    spool.put(b"a", 1, 1, 1)
    machine.run(600)
    spool.close()
    machine.run(1200)  # the agent is down for 20 minutes; the wall clock steps meanwhile
    machine.wall += step
    again = machine.spool(tmp_path, drops)
    assert again.oldest_age() == 1800
    machine.run(1801)
    assert again.expire() == 1 and drops.batches == {"max_age": 1}


@pytest.mark.parametrize("step", [+5 * DAY, -5 * DAY, 0.0])
def test_across_a_reboot_the_time_off_is_not_counted_and_the_uptime_is(tmp_path: Path, step: float) -> None:
    machine, drops = Machine(), Drops()
    spool = machine.spool(tmp_path, drops)
    spool.put(b"a", 1, 1, 1)
    machine.run(600)
    spool.close()
    machine.boot, machine.boottime = "boot-2", 30.0  # off for a while; up again for 30 s when the agent starts
    machine.wall += 7200 + step
    again = machine.spool(tmp_path, drops)
    assert again.oldest_age() == 630
    machine.run(3600 - 630 + 1)
    assert again.expire() == 1 and drops.batches == {"max_age": 1}  # kept no longer than max_age of uptime


def _forget_clock_state(spool: Spool) -> None:
    """Close ``spool`` as an agent from before spool time would: no clock state in the database."""
    assert spool._cache is not None
    spool._cache.delete("m.clock")
    spool._cache.close()
    spool._cache = None


def test_a_spool_without_clock_state_keeps_wall_clock_ages_and_never_goes_below_its_newest_stamp(
    tmp_path: Path,
) -> None:
    """A spool written by an earlier agent stamped its batches with the wall clock: they keep their ages.
    With the wall clock set back since, spool time starts at the newest stamp: no age below zero."""
    machine, drops = Machine(), Drops()
    legacy = SpoolClock(elapsed=lambda: machine.wall, wall=lambda: machine.wall, boot=lambda: "")  # wall stamps
    old = Spool(str(tmp_path), 1 << 30, 3600, on_drop=drops, age=legacy)
    old.open()
    old.put(b"a", 1, 1, 1)
    machine.run(100)
    old.put(b"b", 2, 2, 1)
    _forget_clock_state(old)
    machine.run(50)
    again = machine.spool(tmp_path, drops)
    assert again.oldest_age() == 150
    _forget_clock_state(again)
    machine.wall -= 5 * DAY
    third = machine.spool(tmp_path, drops)
    assert third.oldest_age() == 100  # the newest batch counts as new, the oldest as 100 s older
    machine.run(3600 - 100 + 1)
    assert third.expire() == 1 and len(third) == 1  # and both age from there


def test_a_clock_state_that_does_not_parse_is_said_and_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    machine, drops = Machine(), Drops()
    spool = machine.spool(tmp_path, drops)
    spool.put(b"a", 1, 1, 1)
    assert spool._cache is not None
    spool._cache.set("m.clock", b'{"boot": 7}')
    spool._cache.close()
    spool._cache = None
    machine.run(10)
    again = machine.spool(tmp_path, drops)
    assert "clock state does not parse" in caplog.text
    assert again.oldest_age() == 10  # from the wall clock, the state's fallback
    assert again.rejected == {} and drops.batches == {}


# --- the real agent, its wall clock stepped while it runs ---


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.skip("libfaketime is not installed (apt-get install faketime; .ci/run installs it)")
    return found[0]


def _metrics(port: int) -> dict[str, float]:
    status, body, _ = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    out = {}
    for line in body.decode().splitlines():
        if line.startswith("gpu_exporter_forward_"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_the_agent_keeps_its_spool_through_wall_clock_steps_of_plus_and_minus_five_days(tmp_path: Path) -> None:
    """The broker is unreachable, so batches wait in the spool (``--spool.max-age=8s``). The wall clock
    jumps 5 days ahead: no batch is dropped for its age (it was: every one at once). Then 5 days back:
    batches still age out after 8 s (they were kept until the clock caught up: 5 days)."""
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    port = free_port()
    env = child_env(
        LD_PRELOAD=_libfaketime(),
        FAKETIME_TIMESTAMP_FILE=str(offset),
        FAKETIME_NO_CACHE="1",
        FAKETIME_DONT_FAKE_MONOTONIC="1",
    )
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            exporter_cmd(
                "--gpu-vendor=fake",
                "--fake.gpus=1",
                "--gpu-metrics-collection-interval=100ms",
                "--node-name=edge-1",
                f"--web.listen-address=127.0.0.1:{port}",
                f"--mqtt.url=mqtt://127.0.0.1:{free_port()}",  # nothing listens there
                "--mqtt.batch-interval=200ms",
                "--spool.max-age=8s",
                f"--spool.dir={tmp_path / 'spool'}",
            ),
            env=env,
            stdout=out,
            stderr=out,
        )
    batches = "gpu_exporter_forward_spool_batches"
    aged = 'gpu_exporter_forward_dropped_batches_total{reason="max_age"}'
    try:

        def spooled(n: int) -> bool:
            try:
                return _metrics(port).get(batches, 0) >= n
            except OSError:
                return False

        assert wait_until(lambda: spooled(4), 30), log.read_text()[-3000:]
        before = _metrics(port)
        offset.write_text("+5d\n")
        time.sleep(3)  # three housekeeping turns of the forwarder
        after = _metrics(port)
        assert after[aged] - before[aged] <= 1, (before, after)  # at most the one due anyway, not all
        assert after[batches] >= 4, (before, after)
        assert after["gpu_exporter_forward_spool_oldest_age_seconds"] < 9, after

        offset.write_text("-5d\n")
        stepped = _metrics(port)
        assert wait_until(lambda: _metrics(port)[aged] >= stepped[aged] + 3, 20), (stepped, _metrics(port))
        last = _metrics(port)
        assert last["gpu_exporter_forward_spool_oldest_age_seconds"] < 9, last  # none kept past 8 s
    finally:
        assert stop_process(agent, timeout=15) == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()
