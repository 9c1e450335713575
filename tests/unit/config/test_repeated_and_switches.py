"""Options given more than once (``--web.listen-address``) in each of their forms, and
``--collector.disable-defaults`` as the loader reads it from flags, the environment and the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter import catalog
from gpu_exporter import config as cfg
from gpu_exporter.cli import build_parser

ENV = {"NODE_NAME": "edge-1"}


def _flags(*argv: str) -> cfg.Config:
    return cfg.load(vars(build_parser().parse_args(list(argv))), environ=ENV)


def test_the_flag_given_twice_keeps_both_in_order() -> None:
    config = _flags("--web.listen-address=127.0.0.1:9400", "--web.listen-address", "[::1]:9400")
    assert config.listen_address == ("127.0.0.1:9400", "[::1]:9400")
    assert _flags().listen_address == (":9400",)


def test_the_environment_separates_addresses_with_commas() -> None:
    env = {**ENV, "GPU_EXPORTER_WEB_LISTEN_ADDRESS": "10.0.0.7:9400, 127.0.0.1:9400,[::1]:9400"}
    assert cfg.load({}, environ=env).listen_address == ("10.0.0.7:9400", "127.0.0.1:9400", "[::1]:9400")


def test_the_file_takes_a_list_or_a_string(tmp_path: Path) -> None:
    listed = tmp_path / "listed.yaml"
    listed.write_text('web.listen-address:\n  - "10.0.0.7:9400"\n  - "127.0.0.1:9400"\n')
    assert cfg.load({"config.file": str(listed)}, environ=ENV).listen_address == ("10.0.0.7:9400", "127.0.0.1:9400")
    nested = tmp_path / "nested.yaml"
    nested.write_text('web:\n  listen-address: ":9400"\n')
    assert cfg.load({"config.file": str(nested)}, environ=ENV).listen_address == (":9400",)


def test_flags_replace_the_files_addresses_not_add_to_them(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text('web.listen-address: ["10.0.0.7:9400", "127.0.0.1:9400"]\n')
    args = {"config.file": str(conf), "web.listen-address": ["127.0.0.2:9500"]}
    assert cfg.load(args, environ=ENV).listen_address == ("127.0.0.2:9500",)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('web.listen-address: ["127.0.0.1:9400", "nohost"]\n', "c.yaml:1: invalid listen address 'nohost'"),
        ("web.listen-address: []\n", "c.yaml:1: --web.listen-address: an empty value"),
        ('web.listen-address: "127.0.0.1:9400,"\n', "--web.listen-address: an empty value"),
        ('web.listen-address: ["127.0.0.1:1", "127.0.0.1:1"]\n', "--web.listen-address: 127.0.0.1:1 is given twice"),
        ("web.listen-address: {a: 1}\n", "--web.listen-address takes a list of values, not a mapping"),
    ],
)
def test_bad_addresses_name_their_source(tmp_path: Path, text: str, needle: str) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text(text)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load({"config.file": str(conf)}, environ=ENV)
    assert needle in str(err.value)


def test_other_options_still_take_one_value(tmp_path: Path) -> None:
    conf = tmp_path / "c.yaml"
    conf.write_text("metrics.include: [a, b]\n")
    with pytest.raises(cfg.ConfigError, match="takes one value, not a list"):
        cfg.load({"config.file": str(conf)}, environ=ENV)


def test_disable_defaults_keeps_only_the_groups_named(tmp_path: Path) -> None:
    config = _flags("--collector.disable-defaults", "--collector.power", "--collector.mig")
    assert [g for g in catalog.GROUPS if config.collector_enabled(g)] == ["power", "mig"]
    assert all(cfg.Config().collector_enabled(g) for g in catalog.GROUPS)
    off = _flags("--no-collector.power")
    assert [g for g in catalog.GROUPS if not off.collector_enabled(g)] == ["power"]
    conf = tmp_path / "c.yaml"
    conf.write_text("collector:\n  disable-defaults: true\n  temperature: true\n")
    from_file = cfg.load({"config.file": str(conf)}, environ=ENV)
    assert [g for g in catalog.GROUPS if from_file.collector_enabled(g)] == ["temperature"]
    switched_back = _flags("--collector.disable-defaults=false", "--collector.power")
    assert all(switched_back.collector_enabled(g) for g in catalog.GROUPS)


@pytest.mark.parametrize("flag", ["--web.systemd-socket", "--web.disable-exporter-metrics", "--k8s.pod-attribution"])
def test_boolean_flags_may_be_given_alone(flag: str) -> None:
    option = next(o for o in cfg.OPTIONS if o.name == flag[2:])
    assert getattr(_flags(flag), option.field) is True
    assert getattr(_flags(f"{flag}=false"), option.field) is False
