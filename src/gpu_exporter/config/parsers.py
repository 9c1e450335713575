"""The value parsers of the options, and the Option row they are declared in.

A parser takes the text of a flag, an environment variable or a YAML value and returns the typed value,
or raises ValueError with a message that names the problem; ``load`` adds where the value came from.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpu_exporter.units import format_duration, parse_duration, parse_size

__all__ = [
    "ConfigError",
    "Option",
    "choice",
    "duration_at_least",
    "int_between",
    "parse_bool",
    "parse_digits",
    "parse_group",
    "parse_headers",
    "parse_http_url",
    "parse_idle_power",
    "parse_interval",
    "parse_label_name",
    "parse_listen",
    "parse_max_payload",
    "parse_mqtt_url",
    "parse_nonneg_int",
    "parse_packet_size",
    "parse_path",
    "parse_positive_int",
    "parse_rate",
    "parse_regex",
    "parse_topic_prefix",
    "seconds_between",
    "size_between",
]


class ConfigError(ValueError):
    """A configuration problem the user can fix; the message is one line."""


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"invalid boolean {text!r} (use true or false)")


_MAX_INT = 1_000_000_000  # a ceiling for counts without a tighter bound of their own


def int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(str(text).strip(), 10)
        except ValueError:
            raise ValueError(f"invalid integer {text!r}") from None
        if value < low:
            raise ValueError(f"must be at least {low}, got {value}")
        if value > high:
            raise ValueError(f"{value} is out of range (at most {high})")
        return value

    return parse


parse_positive_int = int_between(1, _MAX_INT)
parse_nonneg_int = int_between(0, _MAX_INT)


def parse_interval(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < 0.1:
        raise ValueError(f"{text!r} is below the 100ms minimum")
    if seconds > 86400:
        raise ValueError(f"{text!r} is above the 1d maximum")
    return seconds


def parse_regex(text: str) -> str:
    try:
        re.compile(str(text))
    except re.error as exc:
        raise ValueError(f"invalid regular expression {text!r}: {exc}") from None
    return str(text)


def choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = str(text).strip().lower()
        if value not in choices:
            raise ValueError(f"invalid choice {text!r} (choose from {', '.join(choices)})")
        return value

    return parse


# --- bridge parsers ---
def parse_http_url(text: str) -> str:
    from urllib.parse import urlsplit

    value = str(text).strip()
    if not value:
        return ""
    try:
        url = urlsplit(value)
        url.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise ValueError(f"invalid URL {text!r}: {exc}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"invalid URL {text!r} (use http://HOST[:PORT]/PATH or https://...)")
    return value


def parse_headers(text: str) -> str:
    value = str(text).strip()
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, sep, _ = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", name.strip()):
            raise ValueError(f"invalid header {item!r} (use Name=value, comma-separated)")
        if name.strip().lower() in (
            "content-type",
            "content-encoding",
            "content-length",
            "host",
            "x-prometheus-remote-write-version",
        ):
            raise ValueError(f"header {name.strip()!r} is set by the bridge itself")
    return value


def parse_label_name(text: str) -> str:
    value = str(text)
    if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", value) or value.startswith("__"):
        raise ValueError(f"invalid label name {text!r}")
    return value


def parse_group(text: str) -> str:
    value = str(text)
    if any(c in value for c in "/+#\0"):
        raise ValueError(f"invalid shared-subscription group {text!r} (no /, + or #)")
    return value


def duration_at_least(low: float, high: float = 365 * 86400.0) -> Callable[[str], float]:
    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if seconds < low:
            raise ValueError(f"{text!r} is below the {low:g}s minimum")
        if seconds > high:
            raise ValueError(f"{text!r} is above the {format_duration(high)} maximum")
        return seconds

    return parse


def parse_packet_size(text: str) -> int:
    from gpu_exporter.units import parse_size as size_of

    size = size_of(text)
    if size != 0 and not 1024 <= size <= 268_435_455:
        raise ValueError(f"{text!r} must be 0 (derived) or 1KiB to 268435455 bytes (the MQTT maximum)")
    return size


def parse_max_payload(text: str) -> int:
    from gpu_exporter.units import parse_size as size_of

    size = size_of(text)
    if size < 1024:
        raise ValueError(f"{text!r} is below the 1KiB minimum")
    if size > 1 << 30:
        raise ValueError(f"{text!r} is above the 1GiB maximum")
    return size


def parse_listen(text: str) -> str:
    value = str(text)
    _host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"invalid listen address {text!r} (use host:port or :port)")
    return value


def parse_idle_power(text: str) -> float | None:
    value = str(text).strip().lower().removesuffix("w")
    if value in ("", "auto"):
        return None
    try:
        watts = float(value)
    except ValueError:
        raise ValueError(f"invalid power {text!r} (use watts, e.g. 30 or 30W, or auto)") from None
    if not 0 <= watts <= 10000:
        raise ValueError(f"invalid power {text!r} (0 to 10000 watts)")
    return watts


def parse_path(text: str) -> str:
    value = str(text)
    if not value.startswith("/"):
        raise ValueError(f"invalid path {text!r} (must start with /)")
    return value


# --- forwarding parsers ---
def parse_mqtt_url(text: str) -> str:
    value = str(text).strip()
    if not value:
        return ""
    try:
        url = urlsplit(value)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"invalid MQTT URL {text!r}: {exc}") from None
    if url.scheme not in ("mqtt", "mqtts"):
        raise ValueError(f"invalid MQTT URL {text!r} (use mqtt://HOST[:PORT] or mqtts://HOST[:PORT])")
    if not url.hostname:
        raise ValueError(f"invalid MQTT URL {text!r}: no host")
    if url.username is not None or url.password is not None:
        raise ValueError(
            "put the MQTT user in --mqtt.username and the password in --mqtt.password-file, not in the URL"
        )
    if url.path not in ("", "/") or url.query or url.fragment:
        raise ValueError(f"invalid MQTT URL {text!r}: no path or query expected")
    if port == 0:
        raise ValueError(f"invalid MQTT URL {text!r}: port 0")
    return value


def parse_topic_prefix(text: str) -> str:
    value = str(text)
    if not value or value.startswith("/") or value.endswith("/") or any(c in value for c in "+#\0"):
        raise ValueError(f"invalid topic prefix {text!r} (no wildcards, no leading or trailing /)")
    return value


def seconds_between(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        seconds = parse_duration(text)
        if not low <= seconds <= high:
            raise ValueError(f"{text!r} is out of range ({low:g}s to {high:g}s)")
        return seconds

    return parse


def size_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        size = parse_size(text)
        if not low <= size <= high:
            raise ValueError(f"{text!r} is out of range ({low} to {high} bytes)")
        return size

    return parse


def parse_digits(text: str) -> int:
    try:
        value = int(str(text), 10)
    except ValueError:
        raise ValueError(f"invalid number of digits {text!r}") from None
    if not 0 <= value <= 17:
        raise ValueError(f"digits must be 0 (exact) to 17, got {value}")
    return value


def parse_rate(text: str) -> float:
    try:
        value = float(str(text))
    except ValueError:
        raise ValueError(f"invalid rate {text!r} (a number per second)") from None
    if not 0.01 <= value <= 100000:
        raise ValueError(f"rate {text!r} is out of range (0.01 to 100000 per second)")
    return value


@dataclass(frozen=True)
class Option:
    name: str  # the flag without dashes, also the YAML key
    field: str  # Config attribute
    parse: Callable[[str], Any]
    help: str
    metavar: str | None = None
    is_switch: bool = False  # a --collector.X / --no-collector.X pair
    # given several times (flags), as a YAML list, or comma-separated (env, YAML string): a tuple of the
    # parsed values, in order; ``parse`` reads one
    repeated: bool = False
