"""Configuration: precedence, validation, and one-line errors that name their source."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_exporter import config as cfg
from gpu_exporter.units import format_duration, parse_duration, parse_size


def test_defaults() -> None:
    c = cfg.load({}, environ={"NODE_NAME": "edge-7"})
    assert (c.gpu_vendor, c.interval, c.buffer_size, c.listen_address) == ("auto", 5.0, 256, (":9400",))
    assert c.node_name == "edge-7"
    assert c.collector_enabled("gpm")


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("gpu-metrics-collection-interval: 10s\nmetrics-buffer-size: 50\nweb:\n  telemetry-path: /f\n")
    env = {"GPU_EXPORTER_METRICS_BUFFER_SIZE": "60", "GPU_EXPORTER_WEB_TELEMETRY_PATH": "/e"}
    c = cfg.load({"config.file": str(f), "web.telemetry-path": "/flag"}, environ=env)
    assert c.interval == 10.0  # file over default
    assert c.buffer_size == 60  # env over file
    assert c.telemetry_path == "/flag"  # flag over env
    assert c.config_file == str(f)


def test_config_file_from_env_and_collectors(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("collector.pcie: false\ncollector:\n  gpm: no\n")
    c = cfg.load({"collector.xid": False}, environ={"GPU_EXPORTER_CONFIG_FILE": str(f)})
    assert c.disabled_collectors == {"pcie", "gpm", "xid"}
    c = cfg.load({"collector.pcie": True}, environ={"GPU_EXPORTER_CONFIG_FILE": str(f)})
    assert "pcie" not in c.disabled_collectors


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            {"gpu-metrics-collection-interval": "5parsecs"},
            {},
            "flag --gpu-metrics-collection-interval: invalid duration",
        ),
        ({"gpu-metrics-collection-interval": "10ms"}, {}, "below the 100ms minimum"),
        ({"metrics-buffer-size": "0"}, {}, "must be at least 1"),
        ({"gpu-vendor": "intel"}, {}, "invalid choice 'intel'"),
        ({}, {"GPU_EXPORTER_WEB_LISTEN_ADDRESS": "nowhere"}, "environment variable GPU_EXPORTER_WEB_LISTEN_ADDRESS"),
        ({"metrics.include": "gpu_(power"}, {}, "invalid regular expression"),
        ({"fake.mig": "8"}, {}, "at most 7 MIG instances"),
        ({}, {"GPU_EXPORTER_COLLECTOR_GPM": "maybe"}, "invalid boolean"),
    ],
)
def test_bad_values_name_their_source(args: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(args, environ=env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_invalid_yaml_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("gpu-vendor: fake\nweb:\n  listen-address: [unclosed\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load({"config.file": str(f)}, environ={})
    assert f"{f}:" in str(info.value) and "invalid YAML" in str(info.value)


def test_unknown_key_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("gpu-vendor: fake\n\nweb:\n  listen-adress: ':9400'\n")
    with pytest.raises(cfg.ConfigError, match=r"c.yaml:4: unknown option 'web.listen-adress'"):
        cfg.load({"config.file": str(f)}, environ={})


def test_bad_value_in_file_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("gpu-vendor: fake\nmetrics-buffer-size: lots\n")
    with pytest.raises(cfg.ConfigError, match=r"c.yaml:2: invalid integer 'lots'"):
        cfg.load({"config.file": str(f)}, environ={})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(cfg.ConfigError, match="cannot read config file"):
        cfg.load({"config.file": str(tmp_path / "missing.yaml")}, environ={})


def test_not_a_mapping(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("- a\n- b\n")
    with pytest.raises(cfg.ConfigError, match="expected a mapping"):
        cfg.load({"config.file": str(f)}, environ={})


def test_every_option_has_env_and_yaml_names() -> None:
    names = [o.name for o in cfg.ALL_OPTIONS]
    assert len(names) == len(set(names))
    assert cfg.env_name("web.listen-address") == "GPU_EXPORTER_WEB_LISTEN_ADDRESS"
    for option in cfg.OPTIONS:
        assert hasattr(cfg.Config(), option.field), option.name


def test_units() -> None:
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1m") == 60
    assert parse_duration("2") == 2
    assert parse_size("64MiB") == 64 * 1024**2
    assert parse_size("1GB") == 10**9
    assert format_duration(0.5) == "500ms" and format_duration(300) == "5m"
    with pytest.raises(ValueError):
        parse_size("lots")
