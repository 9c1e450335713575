"""The call guard and lost-device backoff shared by the vendor backends (backends/_calls.py).

The vendor library is stood in for by plain functions that raise this file's own exceptions; the
classifier maps them to faults the way a backend maps its vendor's errors.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from gpu_exporter.backends._calls import RETRY_MAX, Backoff, CallGuard, Fault, Liveness, Lost
from gpu_exporter.model import DeviceId

log = logging.getLogger("test_backend_calls")


class VendorError(Exception):
    def __init__(self, fault: Fault) -> None:
        super().__init__(fault.name.lower())
        self.fault = fault


def classify(exc: Exception) -> Fault | None:
    return exc.fault if isinstance(exc, VendorError) else None


class Library:
    """A vendor function that fails with a given fault (or answers 42) and counts its calls."""

    def __init__(self, fault: Fault | None = None) -> None:
        self.fault = fault
        self.calls = 0

    def __call__(self, *args: object) -> int:
        self.calls += 1
        if self.fault is not None:
            raise VendorError(self.fault)
        return 42


def guard() -> CallGuard:
    return CallGuard(log, classify, "library has no %s")


def test_unsupported_call_is_asked_once_per_device_and_variant() -> None:
    calls, fn = guard(), Library(Fault.UNSUPPORTED)
    assert [calls.call(0, "get_fan", fn) for _ in range(3)] == [None, None, None]
    assert fn.calls == 1
    calls.call(1, "get_fan", fn)  # another device may support it
    calls.call(0, "get_fan", fn, variant="fan1")  # so may another sensor on the same device
    assert fn.calls == 3
    assert calls.errors == {}  # unsupported is not an error


def test_missing_function_is_logged_once_and_never_asked_again(caplog: pytest.LogCaptureFixture) -> None:
    calls, fn = guard(), Library(Fault.MISSING)
    with caplog.at_level(logging.WARNING, logger=log.name):
        for scope in (0, 1, 0):
            assert calls.call(scope, "get_clocks", fn) is None
            assert calls.call(scope, "get_power", None, variant="avg") is None  # absent from the library
    assert fn.calls == 1  # not asked again, on any device
    assert [r.getMessage() for r in caplog.records] == ["library has no get_clocks", "library has no get_power"]
    assert calls.errors == {}


def test_failures_are_counted_and_retried_lost_raises_empty_is_quiet() -> None:
    calls, failing, empty = guard(), Library(Fault.ERROR), Library(Fault.EMPTY)
    calls.call(0, "get_power", failing)
    calls.call(0, "get_power", failing, variant="cap")
    calls.call(0, "get_processes", empty)
    calls.call(0, "get_processes", empty)
    assert failing.calls == 2 and empty.calls == 2  # both asked again next time
    assert calls.errors == {"get_power": 2}  # counted by call name, variants together
    with pytest.raises(Lost, match="get_uuid: lost"):
        calls.call(0, "get_uuid", Library(Fault.LOST))
    assert calls.errors["get_uuid"] == 1
    assert calls.call(0, "get_uuid", Library()) == 42  # a lost device is asked again once it is back


def test_an_exception_that_is_not_the_vendors_propagates() -> None:
    def broken() -> None:
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        guard().call(0, "broken", broken)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Device:
    clock: Clock
    id: DeviceId = field(default_factory=lambda: DeviceId("0", "GPU-1"))
    live: Liveness = field(default_factory=Liveness)
    answering: bool = False
    attempts: list[float] = field(default_factory=list)


def run(backoff: Backoff, clock: Clock, device: Device, seconds: int) -> list[str | None]:
    """Poll once a second, like the sampler; returns what each poll read."""
    out = []
    for _ in range(seconds):
        out.append(backoff.poll(device, clock(), attach, read))
        clock.now += 1
    return out


def attach(device: Device) -> None:
    device.attempts.append(device.clock())
    if not device.answering:
        raise Lost("no handle")


def read(device: Device) -> str:
    if not device.answering:
        raise Lost("read failed")
    return "sample"


def test_backoff_doubles_to_the_cap_and_starts_over_after_recovery(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    device = Device(clock, answering=True)
    backoff = Backoff(log, 5.0, clock)
    with caplog.at_level(logging.WARNING, logger=log.name):
        device.live.up = True
        assert run(backoff, clock, device, 2) == ["sample", "sample"]

        device.answering = False
        lost_at = clock.now
        run(backoff, clock, device, 1600)
        waits = [b - a for a, b in zip([lost_at, *device.attempts], device.attempts, strict=False)]
        assert waits == [5, 10, 20, 40, 80, 160, 300, 300, 300, 300]  # ends with 300 s, capped
        assert device.live.backoff == RETRY_MAX

        device.answering = True
        clock.now = device.live.retry_at
        assert run(backoff, clock, device, 1) == ["sample"]

        device.answering = False
        device.attempts.clear()
        lost_at = clock.now
        run(backoff, clock, device, 6)
        assert device.attempts == [lost_at + 5]  # the wait starts over from the initial delay

    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "GPU 0 (GPU-1) is not answering (read failed); retrying with backoff",
        "GPU 0 (GPU-1) is back",
        "GPU 0 (GPU-1) is not answering (read failed); retrying with backoff",
    ]  # once per transition, not once per failed retry
