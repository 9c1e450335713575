"""Every duration option holds its lower bound: the documented minimum is accepted, anything below it
(0s in particular: a keepalive of 0 turns keepalive off, a spool max-age of 0 drops every batch) is one
clear line naming the flag, from the loader and from the command line."""

from __future__ import annotations

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.units import parse_duration
from tests.support.procs import one_line_exit_2, run_cli

# option -> (lowest value accepted, a value just below it; None where 0 is allowed)
LOWEST: dict[str, tuple[str, str | None]] = {
    "gpu-metrics-collection-interval": ("100ms", "99ms"),
    "web.read-timeout": ("100ms", "99ms"),
    "web.idle-timeout": ("1s", "999ms"),
    "fake.pcie-call-duration": ("0s", None),
    "mqtt.keepalive": ("5s", "4s"),
    "mqtt.reconnect-max-delay": ("100ms", "99ms"),
    "mqtt.batch-interval": ("50ms", "49ms"),
    "spool.max-age": ("1s", "999ms"),
    "bridge.session-expiry": ("1s", "999ms"),
    "bridge.write-linger": ("0s", None),
    "bridge.max-clock-skew": ("1s", "999ms"),
    "bridge.readiness-timeout": ("1s", "999ms"),
    "remote-write.timeout": ("100ms", "99ms"),
    "remote-write.max-backoff": ("10ms", "9ms"),
    "k8s.refresh-interval": ("100ms", "99ms"),
}


def test_every_duration_option_has_its_bound_checked_here() -> None:
    durations = {o.name for o in cfg.OPTIONS if o.metavar == "DURATION"}
    assert durations == set(LOWEST), "a duration option without a row in LOWEST (or a row for none)"


@pytest.mark.parametrize("name", sorted(LOWEST))
def test_the_minimum_is_accepted_and_below_it_refused_naming_the_flag(name: str) -> None:
    lowest, below = LOWEST[name]
    field = next(o.field for o in cfg.OPTIONS if o.name == name)
    assert getattr(cfg.load({name: lowest}, environ={}), field) == parse_duration(lowest)
    for bad in filter(None, {below, "0s" if parse_duration(lowest) > 0 else None}):
        with pytest.raises(cfg.ConfigError) as info:
            cfg.load({name: bad}, environ={})
        assert f"--{name}" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("flag", ["--spool.max-age=0s", "--mqtt.keepalive=0s", "--mqtt.batch-interval=0s"])
def test_zero_durations_on_the_command_line_are_one_line_and_exit_2(flag: str) -> None:
    assert flag.split("=")[0] in one_line_exit_2(run_cli("--gpu-vendor=fake", flag))
