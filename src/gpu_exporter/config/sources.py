"""Reading the options from their four sources: flag > env ``GPU_EXPORTER_*`` > YAML file > default.

The CLI flags, the environment variable names and the YAML keys are all derived from the option table,
so they cannot drift apart. YAML keys are the flag names without the leading dashes
(``web.listen-address: ":9400"``), flat or nested (``web: {listen-address: ...}``).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any

from gpu_exporter.config.checks import check
from gpu_exporter.config.model import ALL_OPTIONS, BY_NAME, DISABLE_DEFAULTS, OPTIONS, SWITCHES, Config
from gpu_exporter.config.parsers import ConfigError, Option, parse_bool
from gpu_exporter.units import format_duration

__all__ = ["ENV_PREFIX", "add_arguments", "add_option", "env_name", "load", "read_file"]

ENV_PREFIX = "GPU_EXPORTER_"


def env_name(option_name: str) -> str:
    return ENV_PREFIX + re.sub(r"[.\-]", "_", option_name).upper()


def add_arguments(parser: argparse.ArgumentParser, options: Iterable[Option] = OPTIONS) -> None:
    """Declare ``options`` (a command's, ``config/commands.py``), the config file and the collector
    switches as flags; defaults are SUPPRESSed so that we see what was given."""
    parser.add_argument(
        "--config.file",
        dest="config.file",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help=f"YAML file with any of these options (env {env_name('config.file')})",
    )
    defaults = Config()
    for opt in options:
        add_option(parser, opt, getattr(defaults, opt.field))
    group = parser.add_argument_group("collectors (all enabled by default)")
    add_option(group, DISABLE_DEFAULTS, False)  # type: ignore[arg-type]
    for opt in SWITCHES:
        group.add_argument(
            f"--{opt.name}",
            dest=opt.name,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=opt.help,
        )


def add_option(parser: argparse.ArgumentParser, opt: Option, default: Any, help: str | None = None) -> None:
    """One option as a flag, its default shown as the option is written (durations as ``30s``) and
    SUPPRESSed, so that we see what was given; ``help`` replaces the option's own text."""
    if isinstance(default, float) and opt.metavar == "DURATION":
        default = format_duration(default)
    shown = f" (default: {default})" if default not in ("", None) else ""
    if opt.repeated:
        shown = f" (default: {','.join(default)})" if default else ""
    text = f"{opt.help if help is None else help}{shown}"
    if opt.parse is parse_bool:  # --flag alone is --flag=true, as node_exporter's boolean flags
        parser.add_argument(
            f"--{opt.name}",
            dest=opt.name,
            metavar=opt.metavar,
            default=argparse.SUPPRESS,
            nargs="?",
            const="true",
            help=text,
        )
        return
    parser.add_argument(
        f"--{opt.name}",
        dest=opt.name,
        metavar=opt.metavar,
        default=argparse.SUPPRESS,
        action="append" if opt.repeated else "store",
        help=text,
    )


def _parse_repeated(opt: Option, raw: Any, source: str) -> tuple[Any, ...]:
    """A repeated option's values: flags give a list, YAML a list or a string, the environment a string;
    a string holds one value or several separated by commas (``127.0.0.1:9400,[::1]:9400``)."""
    if isinstance(raw, dict):
        raise ConfigError(f"{source}: --{opt.name} takes a list of values, not a mapping")
    items = raw if isinstance(raw, list) else [raw]
    texts = [part.strip() for item in items for part in str(item).split(",")]
    if not texts or any(not text for text in texts):
        raise ConfigError(f"{source}: --{opt.name}: an empty value (give each value once, comma-separated)")
    values = []
    for text in texts:
        try:
            values.append(opt.parse(text))
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
    if len(set(values)) != len(values):
        twice = next(v for v in values if values.count(v) > 1)
        raise ConfigError(f"{source}: --{opt.name}: {twice} is given twice")
    return tuple(values)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, tuple[Any, int]]:
    lines: Mapping[str, int] = data.get("__lines__", {})
    out: dict[str, tuple[Any, int]] = {}
    for key, value in data.items():
        if key == "__lines__":
            continue
        name = f"{prefix}{str(key).replace('_', '-')}"
        if isinstance(value, Mapping) and f"{name}" not in BY_NAME:
            out.update(_flatten(value, name + "."))
        else:
            out[name] = (value, lines.get(key, 0))
    return out


def read_file(path: str) -> dict[str, tuple[Any, int]]:
    from gpu_exporter import safeyaml  # bounded size and depth, no aliases, UTF-8 only

    try:
        data = safeyaml.load_file(path, what="config file")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"invalid config file {path}: expected a mapping of option names to values")
    return _flatten(data)


def load(args: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Config:
    """Merge the sources into a Config, or raise ConfigError naming the source of a bad value."""
    environ = os.environ if environ is None else environ
    values: dict[str, tuple[Any, str]] = {}

    config_file = args.get("config.file") or environ.get(env_name("config.file"), "")
    if config_file:
        for name, (value, line) in read_file(config_file).items():
            if name not in BY_NAME:
                raise ConfigError(f"{config_file}:{line}: unknown option {name!r}")
            values[name] = (value, f"{config_file}:{line}")
    for opt in ALL_OPTIONS:
        env = env_name(opt.name)
        if env in environ:
            values[opt.name] = (environ[env], f"environment variable {env}")
        if opt.name in args:
            values[opt.name] = (args[opt.name], f"flag --{opt.name}")

    fields: dict[str, Any] = {}
    disabled: set[str] = set()
    enabled: set[str] = set()  # switched on by name: what --collector.disable-defaults keeps
    for name, (raw, source) in values.items():
        opt = BY_NAME[name]
        if opt.repeated:
            fields[opt.field] = _parse_repeated(opt, raw, source)
            continue
        if isinstance(raw, (list, dict)):  # str() of a YAML list would pass as a value: ['a', 'b'] is a regex
            what = "a list" if isinstance(raw, list) else "a mapping"
            raise ConfigError(f"{source}: --{name} takes one value, not {what} (join several with '|' or ',')")
        try:
            parsed = opt.parse(str(raw).lower() if isinstance(raw, bool) else str(raw))
        except ValueError as exc:
            raise ConfigError(f"{source}: {exc}") from None
        if opt.is_switch:
            (enabled if parsed else disabled).add(name.split(".", 1)[1])
        else:
            fields[opt.field] = parsed
    fields["disabled_collectors"] = frozenset(disabled)
    fields["enabled_collectors"] = frozenset(enabled)
    fields["config_file"] = str(config_file)
    if not fields.get("node_name"):
        fields["node_name"] = environ.get("NODE_NAME") or socket.gethostname()
    config = Config(**fields)
    check(config)
    return config
