"""Precedence and bounds of every option, driven by the option tables (by class: a new option is covered).

flag > environment (``GPU_EXPORTER_*``) > config file > default, for every row of ``ALL_OPTIONS``, and
``--config.file`` over ``GPU_EXPORTER_CONFIG_FILE``; every bounded number (the parsers ``int_between``,
``size_between``, ``seconds_between``, ``duration_at_least``, whose bounds are read from the row itself)
takes its bounds and refuses a value just outside them with one line and exit 2 from the command that
reads it; so does a listen port over 65535.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from gpu_exporter import cli
from gpu_exporter import config as cfg
from gpu_exporter.config import commands
from gpu_exporter.config.parsers import Option
from gpu_exporter.config.sources import env_name

BOUNDED = ("int_between", "size_between", "seconds_between", "duration_at_least")

# two valid values per parser that is not bounded by numbers (a new parser fails until it is listed here)
SAMPLES: dict[str, tuple[str, str]] = {
    "parse_bool": ("true", "false"),
    "str": ("alpha", "beta"),
    "parse_path": ("/srv/a", "/srv/b"),
    "parse_paths": ("/srv/a", "/srv/b,/srv/c"),
    "parse_regex": ("^gpu_a", "^gpu_b"),
    "parse_http_url": ("http://127.0.0.1:1/a", "https://127.0.0.1:2/b"),
    "parse_interval": ("1s", "2500ms"),
    "parse_listen": ("127.0.0.1:9401", ":9402"),
    "parse_mqtt_url": ("mqtt://127.0.0.1:1883", "mqtts://127.0.0.1:8883"),
    "parse_topic_prefix": ("fleet-a", "fleet/b"),
    "parse_digits": ("3", "6"),
    "parse_rate": ("0", "10"),
    "parse_group": ("ga", "gb"),
    "parse_max_payload": ("64KiB", "1MiB"),
    "parse_packet_size": ("64KiB", "1MiB"),
    "parse_label_name": ("node", "hostname"),
    "parse_headers": ("X-A: 1", "X-B: 2"),
    "parse_idle_power": ("auto", "30W"),
}
# where the parser's table is not the whole rule: a cross-check (config/checks.py) or a value format
VALUES: dict[str, tuple[str, str]] = {
    "spool.replay-rate": ("1", "10"),
    "remote-write.headers": ("X-A=1", "X-B=2"),
    "web.config.file": ("{tmp}/web-a.yml", "{tmp}/web-b.yml"),  # read at load: files that exist
}
EFFECTIVE: dict[str, tuple[float, float]] = {"fake.mig": (0, 7)}  # a GPU holds at most 7 MIG instances


def _kind(opt: Option) -> str:
    return getattr(opt.parse, "__qualname__", "").split(".")[0]


def _bounds(opt: Option) -> tuple[float, float]:
    if opt.name in EFFECTIVE:
        return EFFECTIVE[opt.name]
    found = inspect.getclosurevars(opt.parse).nonlocals
    return found["low"], found["high"]


def _text(opt: Option, value: float) -> str:
    if _kind(opt) in ("seconds_between", "duration_at_least"):
        return f"{round(value * 1000)}ms"
    return str(int(value))


def _two_values(opt: Option) -> tuple[str, str]:
    kind = _kind(opt)
    if opt.name in VALUES:
        return VALUES[opt.name]
    if opt.is_switch:
        return "true", "false"
    if kind == "choice":
        choices = inspect.getclosurevars(opt.parse).nonlocals["choices"]
        return choices[0], choices[1]
    if kind in BOUNDED:
        low, high = _bounds(opt)
        return _text(opt, low), _text(opt, high)
    assert kind in SAMPLES, f"--{opt.name}: add two valid values for its parser {kind} to SAMPLES"
    return SAMPLES[kind]


ROWS = [o for o in cfg.ALL_OPTIONS if o.name != "collector.disable-defaults"]


def _load(
    tmp_path: Path, *, file: str | None = None, env: str | None = None, flag: str | None = None, opt: Option
) -> cfg.Config:
    args: dict[str, Any] = {}
    environ: dict[str, str] = {"NODE_NAME": "edge-07"}
    if file is not None:
        path = tmp_path / "c.yaml"
        path.write_text(f"{opt.name}: {file!r}\n", encoding="utf-8")
        args["config.file"] = str(path)
    if env is not None:
        environ[env_name(opt.name)] = env
    if flag is not None:
        args[opt.name] = [flag] if opt.repeated else flag
    return dataclasses.replace(cfg.load(args, environ), config_file="")


@pytest.mark.parametrize("opt", ROWS, ids=lambda o: o.name)
def test_flag_beats_environment_beats_file_beats_default(tmp_path: Path, opt: Option) -> None:
    a, b = (v.format(tmp=tmp_path) for v in _two_values(opt))
    for path in (a, b):
        if "web-" in path:
            Path(path).write_text("{}\n", encoding="utf-8")
    only_a, only_b = _load(tmp_path, flag=a, opt=opt), _load(tmp_path, flag=b, opt=opt)
    assert only_a != only_b, f"--{opt.name}: the two sample values must differ"  # else nothing is shown
    assert _load(tmp_path, file=a, opt=opt) == only_a
    for x, y, won in ((a, b, only_b), (b, a, only_a)):
        assert _load(tmp_path, file=x, env=y, opt=opt) == won, "the environment beats the file"
        assert _load(tmp_path, env=x, flag=y, opt=opt) == won, "the flag beats the environment"
        assert _load(tmp_path, file=x, flag=y, opt=opt) == won, "the flag beats the file"
        assert _load(tmp_path, file=x, env=x, flag=y, opt=opt) == won, "the flag beats both"


def test_the_config_file_flag_beats_its_environment_variable(tmp_path: Path) -> None:
    by_flag, by_env = tmp_path / "flag.yaml", tmp_path / "env.yaml"
    by_flag.write_text("fake.gpus: 3\n", encoding="utf-8")
    by_env.write_text("fake.gpus: 5\n", encoding="utf-8")
    config = cfg.load({"config.file": str(by_flag)}, {env_name("config.file"): str(by_env), "NODE_NAME": "n"})
    assert (config.fake_gpus, config.config_file) == (3, str(by_flag))
    config = cfg.load({}, {env_name("config.file"): str(by_env), "NODE_NAME": "n"})
    assert (config.fake_gpus, config.config_file) == (5, str(by_env))


def _command(opt: Option) -> list[str]:
    """The command line prefix of a command that reads ``opt``."""
    names = {o.name for o in commands.AGENT}
    if opt.name in names:
        return []
    assert opt.name in {o.name for o in commands.BRIDGE}, f"--{opt.name}: no command reads it"
    return ["bridge"]


def _fails_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own refusals
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    assert code == 2, (argv, err)
    assert "Traceback" not in err and err.count("\n") == 1, (argv, err)
    return err


BOUNDED_ROWS = [o for o in ROWS if _kind(o) in BOUNDED]


@pytest.mark.parametrize("opt", BOUNDED_ROWS, ids=lambda o: o.name)
def test_every_bounded_number_takes_its_bounds_and_refuses_beyond_them(
    tmp_path: Path, opt: Option, capsys: pytest.CaptureFixture[str]
) -> None:
    low, high = _bounds(opt)
    step = 0.001 if _kind(opt) in ("seconds_between", "duration_at_least") else 1
    for ok in (low, high):
        _load(tmp_path, flag=_text(opt, ok), opt=opt)
    outside = [high + step] + ([low - step] if low - step >= 0 or step == 1 else [])
    for bad in outside:
        text = _text(opt, bad)
        with pytest.raises(cfg.ConfigError, match=opt.name.replace(".", r"\.")):
            _load(tmp_path, flag=text, opt=opt)
        err = _fails_with_one_line([*_command(opt), f"--{opt.name}={text}"], capsys)
        assert opt.name in err


@pytest.mark.parametrize("opt", [o for o in ROWS if _kind(o) == "parse_listen"], ids=lambda o: o.name)
@pytest.mark.parametrize("port", ["65536", "99999999999999999999", "-1", "", "x"])
def test_a_listen_port_out_of_range_is_one_line_and_exit_2(
    opt: Option, port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = f"127.0.0.1:{port}"
    with pytest.raises(cfg.ConfigError):  # refused by the loader, before anything would listen
        cfg.load({opt.name: [text] if opt.repeated else text}, {"NODE_NAME": "n"})
    _fails_with_one_line([*_command(opt), f"--{opt.name}={text}"], capsys)
